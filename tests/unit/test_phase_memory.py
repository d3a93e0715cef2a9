"""Device memory by phase of one steady step (scaling/phase_memory.py), driven through its hooks
with a fake caching allocator: `use(n)` sets the bytes allocated now; the peak counter follows
CUDA's rules (max since the last reset; a reset sets it to what is allocated now)."""
import torch

from scalelab.scaling.run_summary import summarize
from scalelab.scaling.phase_memory import PhasePeaks

CUDA = torch.device("cuda", 2)


class FakeAllocator:
    def __init__(self):
        self.now = self.peak = 0
        self.devices = set()

    def use(self, n: int) -> None:
        self.now, self.peak = n, max(self.peak, n)

    def read(self, device):
        self.devices.add(device)
        return {"peak_allocated": self.peak, "peak_reserved": self.peak + 1}

    def reset(self, device):
        self.peak = self.now


def drive(pp: PhasePeaks, mem: FakeAllocator, steps: list[list[tuple[int, int, int]]], device=CUDA,
          backward_hooks: bool = True) -> None:
    """Each step: per micro-batch (forward peak, backward peak, after-backward peak); what the
    step allocates after the last backward (optimizer step) is the last micro's third value."""
    for done, micros in enumerate(steps):
        for fwd, bwd, after in micros:
            pp.batch_start(device, done)
            mem.use(fwd)
            mem.use(fwd // 2)
            if backward_hooks:
                pp.before_backward()
            mem.use(bwd)
            mem.use(bwd // 4)
            if backward_hooks:
                pp.after_backward()
            mem.use(after)
            mem.use(10)
            pp.batch_end()


def test_phases_of_the_chosen_step_and_the_process_peak_kept():
    mem = FakeAllocator()
    pp = PhasePeaks(step=1, accumulate=1, read=mem.read, reset=mem.reset)
    # step 0 peaks at 900 (say, start-up), step 1 is measured, step 2 peaks at 650
    drive(pp, mem, [[(900, 100, 50)], [(500, 700, 300)], [(650, 200, 100)]])
    assert pp.record() == {"step": 1, "forward": 500, "backward": 700, "optimizer_step": 300}
    assert mem.devices == {CUDA}
    # at the end of training the counter holds only what came after the last reset (650)
    end = {"peak_rss_bytes": 1, "peak_device_bytes": mem.peak, "peak_device_reserved_bytes": mem.peak + 1}
    assert end["peak_device_bytes"] == 650
    out = pp.merged(end)
    assert out["peak_device_bytes"] == 900 and out["peak_device_reserved_bytes"] == 901
    assert out["peak_device_bytes_by_phase"]["backward"] == 700


def test_accumulation_takes_each_phase_s_largest_micro_batch():
    mem = FakeAllocator()
    pp = PhasePeaks(step=0, accumulate=2, read=mem.read, reset=mem.reset)
    drive(pp, mem, [[(400, 600, 120), (450, 550, 200)]])
    # the first micro's after-backward (120) belongs to the second micro's forward phase
    assert pp.record() == {"step": 0, "forward": 450, "backward": 600, "optimizer_step": 200}


def test_nothing_on_cpu_and_nothing_without_backward_hooks():
    mem = FakeAllocator()
    cpu = PhasePeaks(step=0, accumulate=1, read=mem.read, reset=mem.reset)
    drive(cpu, mem, [[(400, 600, 120)]], device=torch.device("cpu"))
    assert cpu.record() is None and mem.devices == set()
    assert cpu.merged({"peak_rss_bytes": 5}) == {"peak_rss_bytes": 5}
    # a pipeline schedule runs backward itself (no Lightning backward hooks): no phases, and
    # the peak from before the step is still reported
    mem = FakeAllocator()
    pipe = PhasePeaks(step=1, accumulate=1, read=mem.read, reset=mem.reset)
    drive(pipe, mem, [[(900, 0, 0)], [(300, 400, 0)]], backward_hooks=False)
    assert pipe.record() is None
    out = pipe.merged({"peak_device_bytes": mem.peak, "peak_device_reserved_bytes": mem.peak})
    assert mem.peak == 400 and out["peak_device_bytes"] == 900 and "peak_device_bytes_by_phase" not in out


def test_summarize_writes_the_phases_per_rank():
    def rank(by_phase):
        return {"step_times": [1.0, 1.0], "losses": [1.0, 1.0], "global_steps": [1, 2], "params": 1, "grads": 1,
                "optimizer": 1, "peak_rss_bytes": 1, "peak_device_bytes": 9, "peak_device_reserved_bytes": 9,
                **({"peak_device_bytes_by_phase": by_phase} if by_phase else {})}
    phases = {"step": 0, "forward": 5, "backward": 9, "optimizer_step": 3}
    mem = summarize([rank(phases), rank(phases)], 1, None, 0)["memory"]
    assert mem["peak_device_bytes_by_phase_per_rank"] == [phases, phases]
    # a rank without them (a run too short for the chosen step): none reported
    assert "peak_device_bytes_by_phase_per_rank" not in summarize([rank(phases), rank(None)], 1, None, 0)["memory"]


def test_lightning_calls_the_phase_hooks_in_a_real_run(tmp_path, monkeypatch):
    """scalelab.worker.run on CPU (the real Lightning loop, with gradient accumulation and
    clipping), with PhasePeaks made to accept the CPU and read a fake allocator whose peak grows
    by one each read: each phase must have been opened and closed on the chosen step."""
    from scalelab.scaling import phase_memory

    from ..host_syncs import run_job, write_job

    made = []

    class OnCPU(phase_memory.PhasePeaks):
        def __init__(self, step, accumulate):
            calls = iter(range(1, 10_000))
            super().__init__(step, accumulate, read=lambda d: {"peak_allocated": next(calls), "peak_reserved": 0},
                             reset=lambda d: None)
            made.append(self)

        def batch_start(self, device, steps_done):
            super().batch_start(torch.device("cuda", 0) if device.type == "cpu" else device, steps_done)

    monkeypatch.setattr(phase_memory, "PhasePeaks", OnCPU)
    job = write_job(tmp_path / "job", ["strategy=single", "model=gpt_nano", "logger=none", "trainer.accelerator=cpu",
                                       "trainer.max_steps=6", "trainer.warmup_steps=2", "trainer.profile_steps=0",
                                       "data.global_batch_size=4", "data.micro_batch_size=2",
                                       "trainer.gradient_clip_val=1.0"])
    record = run_job(job)
    assert record["status"] == "completed"
    (pp,) = made
    assert pp.accumulate == 2 and pp.step == 2
    # reads: the step's start, then per micro-batch before and after backward, then its end:
    # 1 + 2 x 2 + 1 = 6, so forward's largest is read 4 (2nd micro), backward 5, the step 6
    assert pp.record() == {"step": 2, "forward": 4, "backward": 5, "optimizer_step": 6}


def test_gpu_check_prints_the_phases_next_to_the_plan_s_parts():
    import importlib.util

    from ..conftest import REPO

    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "benchmarks" / "gpu_check.py")
    gc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gc)
    g = 2 ** 30
    recs = [{"strategy": "zero2", "memory": {"peak_device_bytes_by_phase_per_rank": [
                {"step": 10, "forward": 2 * g, "backward": 3 * g, "optimizer_step": g}]}},
            {"strategy": "single", "memory": {}}]
    plans = {"zero2": {"memory": {"parameters_bytes_per_device": g / 2, "gradients_bytes_per_device": g / 4,
                                  "optimizer_bytes_per_device": 3 * g, "activations_bytes_per_device": 1.5 * g,
                                  "buffers_bytes_per_device": 0.75 * g, "runtime_bytes_per_device": 0.125 * g}}}
    lines = gc.phases_table(recs, plans).splitlines()
    assert lines[2:] == ["| zero2 | 2.00 | 3.00 | 1.00 | 0.50 | 0.25 | 3.00 | 1.50 | 0.75 | 0.12 |"]
    assert gc.phases_table(recs[1:], plans) == ""
