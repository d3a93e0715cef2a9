#!/usr/bin/env bash
# One device session for issue 11, in stages that each write what they found before the next:
#   1. benchmarks/gpu_check.py: hand-written loop, single/ddp/fsdp/zero2/zero3/tp at world 1, plans (86M GPT);
#   2. `single` with pageable batches (data.pin_memory=false) against stage 1's pinned default: what the
#      per-step device drain of an unpinned batch copy costs (the foreach-vs-fused AdamW A/B of
#      run 2 is `SKIP_PAGEABLE=1 FOREACH=1`);
#   3. zero3 with DeepSpeed's per-submodule fetch (stage3_fetch_unit=module) against stage 1's whole-Block
#      default: what the per-submodule hooks cost on the GPU (SKIP_Z3MODULE=1 skips it);
#   (Z2FLAT=1: zero2 with contiguous_gradients=false, the CPU stand-in's faster ZeRO-2 path, benchmarks/gpu_h200.md)
#   4. single and fsdp with GPT-2's 50,257-token vocabulary (the planner's loss-backward term);
#   5. single and fsdp with full activation checkpointing (the planner's full-recompute peak);
#   6. the 1.2B GPT (24 x 2048): single, fsdp, zero3 again at size (host RSS, device memory, the planner);
# then `scalelab plan --calibrate` of the 86M sweep (h200_fit.yaml) and `--validate` of the 1.2B one with it.
# Stages 2-6 run only while the elapsed time leaves room (a device session has 15 minutes).
#   source .gpu/env.sh && bash benchmarks/gpu_device_run.sh "$OUT"      (shared/notes/gpu-device.md)
set -u
OUT=${1:?usage: gpu_device_run.sh OUT_DIR}
W=/tmp/gpu_run
# this script's scratch: a rerun on a warm machine starts clean (gpu_check refuses a sweep folder
# that holds an earlier sweep: the trainer would keep or refuse its jobs, not run them)
rm -rf "$W"
mkdir -p "$W" "$OUT"
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; free -g | head -2
  python3 -c "import sys,torch,lightning,deepspeed;print(sys.version.split()[0],torch.__version__,torch.version.cuda,lightning.__version__,deepspeed.__version__)"
} > "$OUT/env.txt" 2>&1
stage() {  # stage NAME BUDGET_END_S ARGS...: run gpu_check with a deadline at BUDGET_END_S elapsed
  local name=$1 end=$2; shift 2
  local left=$(( end - $(el) ))
  if [ "$left" -lt 60 ]; then echo "[device_run] $name skipped at $(el) s"; return; fi
  echo "[device_run] $name: start at $(el) s, up to $left s"
  timeout "$left" python3 benchmarks/gpu_check.py --out "$W/$name" --deadline $((left - 5)) "$@" > "$W/$name.txt" 2>&1
  echo "[device_run] $name: exit $? at $(el) s"
  # a stage cut by its deadline leaves its sweep and ranks (own sessions) on the GPU: end them
  pkill -9 -f 'scalelab[.](train|worker|cli)|forkserver' 2>/dev/null; sleep 1
  tail -30 "$W/$name.txt"
  cp "$W/$name/gpu_check.md" "$OUT/$name.md" 2>/dev/null
}
stage main ${MAIN_END:-210}
[ -z "${SKIP_PAGEABLE:-}" ] && stage pageable 250 --no-hand --strategies single data.pin_memory=false
[ -z "${SKIP_Z3MODULE:-}" ] && stage z3module 290 --no-hand --strategies zero3 strategy.stage3_fetch_unit=module
[ -n "${Z2FLAT:-}" ] && stage z2flat 330 --no-hand --strategies zero2 strategy.contiguous_gradients=false
[ -n "${FOREACH:-}" ] && stage foreach 330 --no-hand --strategies single optim.fused_on_gpu=false
# GPT-2's vocabulary on the 86M GPT: the planner's cross-entropy backward term (8 s b V bytes: 6.6 GB
# here) and the device peak it predicts, checked on the CPU allocator only so far (SKIP_VOCAB=1 skips)
[ -z "${SKIP_VOCAB:-}" ] && stage vocab ${VOCAB_END:-340} --no-hand --steps 20 --vocab 50257 --strategies single,fsdp
# full activation checkpointing on the 86M GPT: the planner's full-recompute peak (the forward's end
# with every autocast weight copy, the head's backward with only its own, the late moment) on the
# device, checked on the CPU allocator only so far (SKIP_FULL=1 skips)
[ -z "${SKIP_FULL:-}" ] && stage full ${FULL_END:-375} --no-hand --steps 20 --strategies single,fsdp \
  model.arch.activation_checkpointing=full
# single, fsdp, zero3 (run 3's 1.2B rows; ddp, zero2, tp at 1.2B are run 2's): 85 s or more left here
# after the stages before, and a 1.2B job took 71 s in run 1 (BIG_STRATEGIES=single,ddp,... for others)
stage big ${BIG_END:-460} --big --no-hand --steps 20 --strategies "${BIG_STRATEGIES:-single,fsdp,zero3}"
# the planner refitted to this run's 86M sweep (host floors included), checked on its unseen 1.2B sweep
if [ -d "$W/main/sweep" ]; then
  python3 -m scalelab.cli plan --calibrate "$W/main/sweep" --hardware h200 --out "$W/h200_fit.yaml" \
    > "$W/calibrate_main.txt" 2>&1; tail -12 "$W/calibrate_main.txt"
  if [ -d "$W/big/sweep" ]; then  # its table also when a run is off by more than the tolerance (exit 1)
    python3 -m scalelab.cli plan --validate "$W/big/sweep" --hardware "$W/h200_fit.yaml" > "$W/validate_big.txt" 2>&1
    cat "$W/validate_big.txt"
  fi
fi
# everything small that explains the figures: logs, run.json, plans (no checkpoints, no weights)
(cd "$W" && find . -name '*.json' -o -name '*.log' -o -name '*.txt' -o -name '*.md' -o -name '*.yaml' \
  | grep -v -e checkpoints -e '/wandb/' | tar czf "$OUT/results.tgz" -T -)
echo "[device_run] done at $(el) s"; ls -la "$OUT"
