"""verbose=true shows the libraries' deprecation warnings and banners; verbose=false hides them
(torch.distributed's deprecations of what DeepSpeed calls; DeepSpeed's 'built successfully')."""
import contextlib
import io
import warnings

from scalelab import console

DEPRECATION = "`torch.distributed.reduce_scatter_tensor` is deprecated. Users should use reduce_scatter_tensor"


def _shown(verbose: bool) -> int:
    with warnings.catch_warnings(record=True) as seen:   # restores the filters quiet_rank adds
        warnings.simplefilter("always")
        console.quiet_rank(0, verbose)
        warnings.warn(DEPRECATION, FutureWarning)
    return len(seen)


def _banner(verbose: bool) -> str:
    console._VERBOSE[0] = verbose
    out = io.StringIO()
    with contextlib.redirect_stdout(out), console.quiet_banner():
        print("DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully")
        print("something else it says")
    console._VERBOSE[0] = False
    return out.getvalue()


def test_deprecations_and_banners_only_with_verbose():
    assert _shown(verbose=True) == 1 and _shown(verbose=False) == 0
    assert _banner(verbose=True).count("\n") == 2
    assert _banner(verbose=False) == "something else it says\n"
