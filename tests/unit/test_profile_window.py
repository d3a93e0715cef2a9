"""The profiled window is excluded from the measured steps, so it is taken only where
MIN_MEASURED_STEPS (5) remain after the warm-up: with warm-up 5 and 3 profiled steps, max_steps
11-12 profiled and left 3-4 measured steps (a short run), while 10 left 5 and no profile."""
from types import SimpleNamespace

from omegaconf import OmegaConf

from scalelab.worker import _profile_window


def _window(max_steps, warmup=5, profile=3, resumed=False):
    cfg = OmegaConf.create({"trainer": {"max_steps": max_steps, "warmup_steps": warmup, "profile_steps": profile}})
    return _profile_window(cfg, SimpleNamespace(batch=SimpleNamespace(accumulate_grad_batches=1)), resumed)


def test_a_profile_leaves_five_measured_steps():
    assert [m for m in range(8, 16) if _window(m) is not None] == [13, 14, 15]   # 13 - 5 - 3 = 5 measured
    assert _window(20, profile=0) is None and _window(20, resumed=True) is None


def test_a_checkpoint_saved_in_the_window_is_neither_step_time_nor_comm():
    """A periodic save inside the window (checkpoint.every_n_steps dividing max_steps saves at the
    window's last step) was profiled as the step's: its barriers counted as communication
    (single@2: comm 16 %, 83 % in a walkthrough, 0 % without checkpoints)."""
    import time

    import torch

    from scalelab.checkpointing import SAVE_MARK
    from scalelab.scaling.breakdown import ProfileWindow

    window = ProfileWindow(start_step=0, steps=2, accumulate=1)
    trainer, module = SimpleNamespace(global_step=0), SimpleNamespace(device=torch.device("cpu"))
    window.on_train_start(trainer, module)
    for step in range(2):
        window.on_train_batch_start(trainer, module, None, 0)
        time.sleep(0.02)                                        # the step's compute
        with torch.profiler.record_function("gloo:all_reduce"):
            time.sleep(0.01)                                    # its own collective: comm
        trainer.global_step += 1
        if step == 1:
            with torch.profiler.record_function(SAVE_MARK):     # PeriodicCheckpoint's save
                with torch.profiler.record_function("c10d::barrier"):
                    time.sleep(0.2)
        window.on_train_batch_end(trainer, module, None, None, 0)
    r = window.result
    assert 0.009 < r["comm_s"] < 0.05, r                       # 10 ms a step, not + 100 ms of barrier
    assert 0.029 < r["step_s"] < 0.09, r                       # 30 ms a step, not + 100 ms of save


def test_on_a_gpu_the_device_work_of_a_save_is_left_out():
    """The CUDA path reads kernels from the trace: a save's NCCL barrier (waiting on the device while
    rank 0 writes the file) was exposed communication, its copies device busy time."""
    from scalelab.checkpointing import SAVE_MARK
    from scalelab.scaling.breakdown import device_anatomy, gpu_comm, outside_saves

    def x(name, cat, ts, dur):
        return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur}

    trace = {"traceEvents": [
        x("gemm", "kernel", 0, 800), x("ncclDevKernel_AllReduce", "kernel", 800, 200),   # the step: 1 ms
        x(SAVE_MARK, "user_annotation", 1000, 5000), x(SAVE_MARK, "gpu_user_annotation", 1000, 5200),
        x("ncclDevKernel_AllReduce", "kernel", 1100, 4900), x("Memcpy DtoH", "gpu_memcpy", 1050, 40)]}
    kept = outside_saves(trace)
    assert gpu_comm(kept)["exposed_us"] == 200 and gpu_comm(trace)["exposed_us"] == 5100
    assert device_anatomy(kept, steps=1, step_s=0.001)["busy_s"] == 0.001
    assert outside_saves({"traceEvents": trace["traceEvents"][:2]})["traceEvents"] == trace["traceEvents"][:2]


def test_cpu_comm_is_what_the_training_thread_does_not_hide():
    """gloo runs collectives on its own threads, from posting to completion: DDP's bucket all-reduces
    overlap backward, a pipeline posts sends/receives ahead of its compute. Counting their whole
    intervals made compute + comm of a pipeline stage exceed its step. Times in microseconds."""
    from scalelab.scaling.breakdown import _DRAIN, cpu_comm_us

    def ev(name, thread, start, end):
        return SimpleNamespace(name=name, thread=thread, time_range=SimpleNamespace(start=start, end=end))

    events = [ev("aten::addmm", 1, 0, 30), ev("aten::mm", 1, 40, 70),         # the training thread's compute
              ev("c10d::allreduce_", 1, 30, 31),                              # posting it: not compute
              ev("gloo:all_reduce", 2, 20, 60), ev("gloo:all_reduce", 3, 75, 90),
              ev("aten::copy_", 2, 22, 50),                                   # gloo's thread: hides nothing
              ev(_DRAIN, 1, 100, 110), ev("gloo:barrier", 2, 100, 108)]      # the drain's barrier: left out
    # comm union: [20, 60] + [75, 90] = 55; the training thread's aten ops cover [20, 30] and [40, 60]: 30
    assert cpu_comm_us(events, []) == 25
    # a save's ops are left out (its barrier and the collective posted inside it)
    assert cpu_comm_us(events, [(74, 95)]) == 25 - 15
    # no drain mark (an old window): nothing is known to be the training thread, every interval counts
    assert cpu_comm_us([e for e in events if e.name != _DRAIN], []) == 55 + 8


def test_a_wait_inside_an_op_is_communication():
    """DTensor's async collectives (tp, fsdp_tp, nd) return tensors whose next op waits for them:
    _c10d_functional::wait_tensor inside an aten::addmm; that wait is no compute."""
    from scalelab.scaling.breakdown import _DRAIN, _minus, cpu_comm_us

    def ev(name, thread, start, end):
        return SimpleNamespace(name=name, thread=thread, time_range=SimpleNamespace(start=start, end=end))

    events = [ev("_c10d_functional::all_reduce", 1, 0, 2), ev("gloo:all_reduce", 2, 2, 40),
              ev("aten::addmm", 1, 10, 50), ev("_c10d_functional::wait_tensor", 1, 12, 40),
              ev(_DRAIN, 1, 100, 101)]
    # comm: [0, 40] (the posting, gloo's op and the wait); compute: the addmm [10, 50] less its
    # wait [12, 40] = [10, 12] + [40, 50]; exposed: 40 - 2 (the [10, 12] the addmm computed) = 38
    assert cpu_comm_us(events, []) == 38
    assert _minus([(0, 10), (20, 30)], [(5, 22), (25, 26), (29, 40)]) == [(0, 5), (22, 25), (26, 29)]
