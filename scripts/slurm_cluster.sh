#!/usr/bin/env bash
# A real single-node SLURM cluster on this machine, for the SLURM tests and CI:
#   scripts/slurm_cluster.sh up       install (Debian packages) and start munge, MariaDB, slurmdbd,
#                                     slurmctld, slurmd; returns once `sinfo` says idle
#   scripts/slurm_cluster.sh down     stop them (reverse order, by the PIDs this script recorded)
#   scripts/slurm_cluster.sh status   exit 0 "up ..."; 3 "down: ..." (can run: start it with `up`);
#                                     2 "cannot run here: ..." (the tests skip with that line)
# Settings from shared/notes/local-slurm.md (no systemd, no cgroups). Accounting (slurmdbd +
# MariaDB) is not optional: without it `sacct` fails and a cancelled or requeued job's state is
# unknown, so a job's final SLURM state could not be recorded.
# State lives in $SCALELAB_SLURM_DIR (default /var/tmp/scalelab-slurm); the config is written to
# /etc/slurm/slurm.conf so that every client (sbatch, srun inside jobs, sacct) finds it as on a
# real cluster.
set -uo pipefail
DIR="${SCALELAB_SLURM_DIR:-/var/tmp/scalelab-slurm}"
CONF=/etc/slurm/slurm.conf
DBDCONF=/etc/slurm/slurmdbd.conf
PKGS=(slurmctld slurmd slurm-client slurm-wlm-basic-plugins munge slurmdbd mariadb-server)
NODE="$(hostname -s)"

say() { echo "[slurm_cluster] $*" >&2; }

cannot_run() {  # why this machine cannot host the cluster (empty: it can)
  [ "$(uname -s)" = Linux ] || { echo "not Linux"; return; }
  [ "$(id -u)" = 0 ] || { echo "needs root (starts munged, slurmctld, slurmd as root)"; return; }
  if ! command -v slurmctld >/dev/null || ! command -v slurmdbd >/dev/null || ! command -v mariadbd >/dev/null; then
    command -v apt-get >/dev/null || { echo "SLURM is not installed and there is no apt-get to install it"; return; }
  fi
}

node_state() { timeout 5 sinfo -h -o %T 2>/dev/null | head -1; }

status() {
  local why; why="$(cannot_run)"
  if [ -n "$why" ]; then echo "cannot run here: $why"; return 2; fi
  if [ -f "$CONF" ] && [ -f "$DIR/slurmctld.pid" ] && kill -0 "$(cat "$DIR/slurmctld.pid")" 2>/dev/null; then
    local st; st="$(node_state)"
    case "$st" in
      idle*|mixed*|allocated*|completing*) 
        if timeout 5 sacct -n -X -S now-1minutes >/dev/null 2>&1; then
          echo "up: node $NODE $st, accounting on (config $CONF, state $DIR)"; return 0
        fi
        echo "down: slurmctld runs but sacct does not answer (accounting down); run scripts/slurm_cluster.sh down && up"
        return 3 ;;
    esac
    echo "down: slurmctld runs but the node is '${st:-unknown}'"; return 3
  fi
  echo "down: no cluster started by this script (start it: scripts/slurm_cluster.sh up)"; return 3
}

install() {
  local missing=()
  for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  say "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

start_bg() {  # name pidfile command...: start detached (setsid: survives this shell), record its PID
  local name="$1" pidfile="$2"; shift 2
  setsid "$@" >>"$DIR/log/$name.log" 2>&1 < /dev/null &
  echo $! > "$pidfile"
}

wait_for() {  # seconds description command...
  local t="$1" what="$2"; shift 2
  local end=$((SECONDS + t))
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $end ]; then say "$what did not become ready in ${t}s; logs in $DIR/log"; return 1; fi
    sleep 0.2
  done
}

write_conf() {
  local cpus mem
  # Two slots per core: the tests' jobs spend most of their time starting (imports), not computing,
  # and run side by side; config_overrides makes slurmd accept more CPUs than it detects.
  cpus=$(( $(nproc) * ${SCALELAB_SLURM_SLOTS_PER_CORE:-2} ))
  mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 8 / 10 ))  # 80 %: leave the OS its share
  mkdir -p /etc/slurm "$DIR"/{log,spool/ctld,spool/d,run,mysql}
  cat > "$CONF" <<EOF
# Written by scalelab scripts/slurm_cluster.sh: one node, no systemd or cgroups (test cluster).
ClusterName=scalelab
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmdParameters=config_overrides
MailProg=/bin/true
# submitted jobs' steps get SIGTERM, then SIGKILL after KillWait: 5 s is enough to save a small checkpoint
KillWait=5
# A process of a step still there this long after SIGKILL drains the node ("Kill task failed"), and
# every later job then pends (ReqNodeNotAvail) until the tests time out: seen once in CI, where a
# batch step outlived its SIGKILL by more than the default 60 s on a loaded VM (its other steps
# ended within 5 s; cause not found). Production clusters on slow storage raise it the same way.
UnkillableStepTimeout=180
# sched_interval: a requeued job whose BeginTime passed starts within seconds, not at the next 60 s pass
SchedulerParameters=batch_sched_delay=0,sched_interval=2
# A requeued job waits cred_expire+1 s before it may start again (default 120 s): the tests requeue
# jobs and wait for them, so keep it short on this test cluster.
AuthInfo=cred_expire=5
JobRequeue=1
StateSaveLocation=$DIR/spool/ctld
SlurmdSpoolDir=$DIR/spool/d
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
JobAcctGatherType=jobacct_gather/linux
JobCompType=jobcomp/none
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$cpus Sockets=1 CoresPerSocket=$cpus ThreadsPerCore=1 RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  cat > "$DBDCONF" <<EOF
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
PidFile=$DIR/run/slurmdbd.pid
LogFile=$DIR/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=3306
StorageUser=slurm
StoragePass=scalelab-test-only
StorageLoc=slurm_acct_db
EOF
  chmod 600 "$DBDCONF"
}

up() {
  local why; why="$(cannot_run)"
  if [ -n "$why" ]; then echo "cannot run here: $why"; return 2; fi
  if status >/dev/null; then status; return 0; fi
  install || { echo "down: installing ${PKGS[*]} failed"; return 1; }
  down >/dev/null 2>&1 || true
  write_conf
  # 1. munge (the package created /etc/munge/munge.key)
  mkdir -p /run/munge && chown munge:munge /run/munge
  if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    start_bg munged "$DIR/munged.pid" runuser -u munge -- /usr/sbin/munged --foreground
    wait_for 10 munged sh -c 'munge -n | unmunge' || return 1
  fi
  # 2. MariaDB in its own data folder (not the system one), with a user for slurmdbd
  if [ ! -d "$DIR/mysql/mysql" ]; then
    mariadb-install-db --no-defaults --user=root --datadir="$DIR/mysql" >"$DIR/log/mariadb-install.log" 2>&1 || {
      say "mariadb-install-db failed (see $DIR/log/mariadb-install.log)"; return 1; }
  fi
  start_bg mariadbd "$DIR/mariadbd.pid" /usr/sbin/mariadbd --no-defaults --user=root --datadir="$DIR/mysql" \
    --socket="$DIR/run/mysqld.sock" --pid-file="$DIR/run/mysqld.pid" --bind-address=127.0.0.1 --port=3306
  wait_for 30 mariadbd mariadb --no-defaults --socket="$DIR/run/mysqld.sock" -uroot -e 'select 1' || return 1
  mariadb --no-defaults --socket="$DIR/run/mysqld.sock" -uroot -e \
    "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'scalelab-test-only';
     CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'scalelab-test-only';
     GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';" || return 1
  # 3. slurmdbd; slurmctld registers the cluster with it by itself
  start_bg slurmdbd "$DIR/slurmdbd.pid" /usr/sbin/slurmdbd -D
  wait_for 30 slurmdbd sacctmgr -n show cluster || return 1
  # 4. controller and node daemon
  start_bg slurmctld "$DIR/slurmctld.pid" /usr/sbin/slurmctld -D -i
  start_bg slurmd "$DIR/slurmd.pid" /usr/sbin/slurmd -D
  # The node's state outlives a restart (slurmctld's saved state): a node an earlier run left drained
  # ("Kill task failed") would never be idle again. A test cluster starts with its node in service.
  wait_for 60 "the node (sinfo idle)" sh -c 'st=$(sinfo -h -o %T | head -1)
    case "$st" in drain*) scontrol update NodeName="$1" State=RESUME >/dev/null 2>&1 ;; esac
    echo "$st" | grep -q "^idle"' _ "$NODE" || return 1
  wait_for 30 "accounting (sacct)" sacct -n -X -S now-1minutes || return 1
  status
}

down() {
  local name pid
  # a test cluster: jobs still queued or running are cancelled first, so no rank outlives it
  if [ -f "$DIR/slurmctld.pid" ] && kill -0 "$(cat "$DIR/slurmctld.pid")" 2>/dev/null; then
    timeout 10 squeue -h -o %i 2>/dev/null | xargs -r timeout 10 scancel >/dev/null 2>&1 || true
    for _ in $(seq 50); do [ -z "$(timeout 5 squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.2; done
  fi
  for name in slurmd slurmctld slurmdbd mariadbd munged; do
    [ -f "$DIR/$name.pid" ] || continue
    pid="$(cat "$DIR/$name.pid")"
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid" 2>/dev/null
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
      kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$DIR/$name.pid"
  done
  echo "down"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
