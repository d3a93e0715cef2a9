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
