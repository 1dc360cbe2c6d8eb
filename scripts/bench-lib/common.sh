# shellcheck shell=bash
# Helpers of the bench scripts (scripts/bench-*), sourced once the script has gone to the
# repository's root (`cd "$(dirname "$0")/.."`):
#   . scripts/bench-lib/common.sh
# The script keeps the processes it starts in the array `pids` and its temporary files in the
# directory `dir`, both set before its EXIT trap runs.

# A TCP port that is free on 127.0.0.1 (the kernel's pick, released again).
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# A redis-server's CPU time so far (µs, used_cpu_user + used_cpu_sys, INFO cpu).
redis_cpu_us() { # port
  redis-cli -p "$1" info cpu | tr -d '\r' | awk -F: '/^used_cpu_(user|sys):/ { s += $2 } END { printf "%d", s * 1e6 }'
}

# bench_cleanup [--term] [--wait] [--keep NOTE]: what the EXIT trap does (directly, or from a
# script's own cleanup with extra steps).
#   Every process in `pids` gets SIGINT (the fast shutdown of tollgate and nginx), and 0.3 s
#   later SIGKILL; with --term, one SIGTERM each and nothing more.
#   --wait: then waits for all of the script's background processes.
#   `dir` is removed; with --keep and KEEP=1 it stays, and "kept DIR (NOTE)" is printed.
# shellcheck disable=SC2154 # pids and dir are the sourcing script's
bench_cleanup() {
  local term=0 wait_all=0 note="" p
  while [ $# -gt 0 ]; do
    case $1 in
      --term) term=1 ;;
      --wait) wait_all=1 ;;
      --keep) note=${2-}; shift ;;
      *) echo "bench_cleanup: unknown option $1" >&2; return 2 ;;
    esac
    shift
  done
  if [ "$term" = 1 ]; then
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  else
    for p in "${pids[@]}"; do kill -INT "$p" 2>/dev/null || true; done
    sleep 0.3
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  fi
  if [ "$wait_all" = 1 ]; then wait 2>/dev/null || true; fi
  if [ -n "$note" ] && [ "${KEEP:-0}" = 1 ]; then echo "kept $dir ($note)"; else rm -rf "$dir"; fi
}

# write_section NAME FILE: FILE's text, from `<!-- NAME:begin -->` to `<!-- NAME:end -->`,
# replaces that section of BENCHMARKS.md, or is appended when there is none yet
# (scripts/bench-lib/section.py).
write_section() { python3 scripts/bench-lib/section.py "$1" "$2"; }
