"""The launcher's preflight lets torch check the optimizer's arguments on a throwaway optimizer, and
that must not import torch._dynamo (2.9 s of CPU in every `scalelab-train`, measured by cProfile:
preflight 3.75 s with it, 0.22 s without). In a fresh interpreter: nothing imported it before."""
import json
import subprocess
import sys

CODE = """
import json, sys
import torch
from scalelab.errors import ConfigError
from scalelab.preflight import preflight
out = {}
preflight(sys.argv[1:])
out["dynamo_after_preflight"] = "torch._dynamo" in sys.modules
# the wrappers' cache is left as torch had it: empty, filled by torch on a real optimizer's first use
out["cache_left"] = hasattr(torch.optim.Optimizer.add_param_group.__wrapped__, "__dynamo_disable")
try:
    preflight([*sys.argv[1:], "+optim.optimizer.foo=1"])
    out["refused"] = None
except ConfigError as e:
    out["refused"] = str(e)
out["dynamo_after_refusal"] = "torch._dynamo" in sys.modules
print(json.dumps(out))
"""


def _run(*args: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", CODE, *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_preflight_checks_the_optimizer_without_importing_dynamo():
    for args in (["model=gpt_nano", "optim=sgd"], ["model=gpt_nano", "optim=adamw", "strategy=ddp",
                                                   "trainer.devices=2"]):
        out = _run(*args)
        assert out["dynamo_after_preflight"] is False, args
        assert out["cache_left"] is False, args
        assert out["refused"] is not None and "unexpected keyword argument 'foo'" in out["refused"], out
        assert out["dynamo_after_refusal"] is False, args


PLAN_CODE = """
import json, sys
import torch
from scalelab.models.build import count_parameters
from scalelab.models.gpt import GPTConfig
from scalelab.models.mlp import MLPConfig
out = {"counted": [count_parameters(GPTConfig(n_layers=3, n_heads=4, d_model=64, seq_len=32, vocab_size=300)),
                   count_parameters(MLPConfig())]}
out["dynamo"] = "torch._dynamo" in sys.modules
print(json.dumps(out))
"""


def test_the_planner_counts_parameters_without_importing_dynamo():
    """`scalelab plan OVERRIDES` counts the model's parameters on the meta device with torch.nn.init
    skipped (its meta path imported torch._dynamo: `plan` 5.2 s -> 3.2 s). The count is the model's,
    by hand: 3 blocks of 4 x 64 x 64 (attention) + 2 x 64 x 256 (MLP) + 2 x 2 x 64 (LayerNorms),
    embeddings 300 x 64 + 32 x 64, final LayerNorm 2 x 64, head 300 x 64; the default MLP 64-256-256-10."""
    proc = subprocess.run([sys.executable, "-c", PLAN_CODE], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["dynamo"] is False
    block = 4 * 64 * 64 + 2 * 64 * 256 + 2 * 2 * 64
    assert out["counted"][0] == 3 * block + 300 * 64 + 32 * 64 + 2 * 64 + 300 * 64
    assert out["counted"][1] == (64 * 256 + 256) + (256 * 256 + 256) + (256 * 10 + 10)   # MLPConfig(): weights + biases
