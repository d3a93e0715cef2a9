#!/usr/bin/env bash
# A planner sweep in passes, one seed per pass. Each pass is the experiment's multirun (every
# strategy on its N ranks) followed at once by the one-rank baseline (strategy=single,
# trainer.devices=1) of the same models and batch sizes.
#
# Why passes: on a shared host one run's speed differs from the next by 10-25 % (whole runs, not
# single steps), and the host drifts over an hour. Run as one block after the main sweep, the
# baseline's repeats sat within minutes of each other and missed the drift together (session 8:
# three seeds of single@1 within 2.5 min, all 8-26 % faster than predicted). Spread over the passes,
# every config's repeats sample the whole hour, and --validate takes their median.
#
# usage: scripts/plan_sweep.sh EXPERIMENT OUT_DIR SEEDS [hydra overrides...]
#   scripts/plan_sweep.sh plan_validation outputs/plan_validation 1,2,3,4,5
#   -> OUT_DIR/seed1/all, OUT_DIR/seed1/alone, OUT_DIR/seed2/all, ...; then
#   scalelab plan --validate OUT_DIR --hardware this_cpu_calibrated --tolerance 0.15
# DRY_RUN=1 prints the commands instead of running them.
set -uo pipefail

if [ $# -lt 3 ]; then
    echo "usage: $0 EXPERIMENT OUT_DIR SEEDS [hydra overrides...]   (SEEDS: comma-separated, e.g. 1,2,3)" >&2
    exit 2
fi
experiment=$1 out=$2 seeds=$3
shift 3
if ! [[ $seeds =~ ^[0-9]+(,[0-9]+)*$ ]]; then
    echo "SEEDS=${seeds@Q} is not valid: give comma-separated integers, e.g. 1,2,3" >&2
    exit 2
fi
here=$(cd "$(dirname "$0")/.." && pwd)
if [ ! -f "$here/conf/experiment/$experiment.yaml" ]; then
    echo "EXPERIMENT=${experiment@Q} is not valid: choose one of" \
         "$(cd "$here/conf/experiment" && ls *.yaml | sed 's/\.yaml$//' | paste -sd, -)" >&2
    exit 2
fi
train=${SCALELAB_TRAIN:-$here/.venv/bin/scalelab-train}
[ -x "$train" ] || train=$(command -v scalelab-train) || {
    echo "scalelab-train not found (no $here/.venv): run \`make setup\` or set SCALELAB_TRAIN" >&2
    exit 2
}

run() {
    if [ -n "${DRY_RUN:-}" ]; then echo "$*"; else "$@"; fi
}

# The baseline pass is single on 1 rank whatever narrows the main pass: a user's strategy=ddp (a
# task override, which beats the sweeper's params) made the "one-rank baseline" a ddp run.
alone=()
for a in "$@"; do
    case $a in strategy=*|+strategy=*|++strategy=*|trainer.devices=*|++trainer.devices=*) ;; *) alone+=("$a") ;; esac
done
failed=0
for seed in ${seeds//,/ }; do
    # ++: the seed is a sweeper param whether or not the experiment sweeps it (plan_calibration does
    # not: `hydra.sweeper.params.seed=` was refused, and the README's command failed at once)
    run "$train" -m "experiment=$experiment" "++hydra.sweeper.params.seed=$seed" \
        "hydra.sweep.dir=$out/seed$seed/all" "$@" || failed=1
    # The baseline's own overrides last: a user's devices override cannot undo them.
    run "$train" -m "experiment=$experiment" "++hydra.sweeper.params.seed=$seed" \
        "hydra.sweep.dir=$out/seed$seed/alone" "${alone[@]}" \
        hydra.sweeper.params.strategy=single trainer.devices=1 || failed=1
done
# A failed job is recorded in its sweep (status: failed) and the passes go on; say so at the end.
[ $failed = 0 ] || echo "$0: some jobs failed; see sweep.json in $out/seed*/" >&2
exit $failed
