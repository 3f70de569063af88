# Settings of scripts/bench/run.sh (sourced): corpus sizes, runs, where the
# results and the report go. QUICK=1 is make bench-quick's tiny version.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bin=$root/target/release/sessionfs
tool=$root/target/release/sessionfs-bench
quick=${QUICK:-0}
if [ "$quick" = 1 ]; then
  dir=$root/.bench/quick
  s_files=2000 m_entries=5000 b_count=1 b_size=$((64 << 20)) write_files=300
  runs=1 slow_runs=1 scale_entries="1000 3000" scale_units="1 2" scale_unit=$((16 << 20))
  report=$dir/benchmarks.md
else
  dir=$root/.bench
  s_files=${BENCH_FILES:-100000} m_entries=250000 b_count=3 b_size=$((1 << 30)) write_files=5000
  runs=${BENCH_RUNS:-5} slow_runs=${BENCH_SLOW_RUNS:-3}
  scale_entries=${BENCH_SCALE_ENTRIES:-"10000 100000 250000"}
  scale_units=${BENCH_SCALE_GIB:-"1 4 16"} scale_unit=$((1 << 30))
  report=$root/docs/benchmarks.md
fi
results=$dir/results.jsonl
failures=$dir/failures.txt
S=$dir/S-$s_files M=$dir/M-$m_entries B=$dir/B-$b_count-$b_size W=$dir/W-$write_files
mnt=$dir/mnt
venv=$root/.bench/venv
ratarmount=$venv/bin/ratarmount
scale=$dir/scale.dat
scale_b=$dir/scale-bytes.dat
unit_name=$([ "$scale_unit" = $((1 << 30)) ] && echo GiB || echo "x $((scale_unit >> 20)) MiB")
log() { printf '\033[1mbench: %s\033[0m\n' "$*" >&2; }
