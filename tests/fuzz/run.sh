#!/usr/bin/env bash
# Runs every libFuzzer target (tests/fuzz) for SECONDS each on its seed corpus, two at a time, and fails on
# any crash, hang (-timeout=10), memory blow-up (-rss_limit_mb=2048, one allocation > 2048 MB) or sanitizer report.
#
#   tests/fuzz/run.sh BUILD_DIR SECONDS [TARGET...]     (build with tests/fuzz/build.sh BUILD_DIR)
#
# New inputs go to BUILD_DIR/fuzz-work/NAME/corpus (the committed corpus/NAME is only read), crashing inputs to
# BUILD_DIR/fuzz-work/NAME/ (crash-*, timeout-*, oom-*); each target's log is BUILD_DIR/fuzz-work/NAME.log and
# its last status line (runs, coverage, exec/s) is printed. FUZZ_JOBS (default 2) targets run at once.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ $# -lt 2 ]]; then
  echo "usage: $0 BUILD_DIR SECONDS [TARGET...]" >&2
  exit 2
fi
build="$(cd "$1" && pwd)"
seconds="$2"
shift 2
# name and -max_len: enough for the largest seed, small enough to stay fast
declare -A max_len=(
  [graph]=4096 [dschat_data]=4096 [lm_data]=4096 [ds_config]=4096 [safetensors]=8192 [hf]=8192
  [llama2c]=4096 [adapter]=8192 [tokenizer]=1024 [hf_tokenizer]=8192 [console]=2048 [cluster]=4096
  [chat_template]=8192
)
targets=("$@")
((${#targets[@]})) || targets=(graph dschat_data lm_data ds_config safetensors hf llama2c adapter tokenizer hf_tokenizer console cluster
                                chat_template)
work="$build/fuzz-work"
# stack traces with file:line (Debian's llvm-symbolizer, where installed)
for s in llvm-symbolizer-16 llvm-symbolizer; do
  if command -v "$s" >/dev/null; then export ASAN_SYMBOLIZER_PATH="$(command -v "$s")"; break; fi
done
mkdir -p "$work"

run_one() {
  local name="$1" bin="$build/bin/fuzz_$1"
  [[ -x "$bin" ]] || { echo "fuzz: $name: $bin is missing (tests/fuzz/build.sh $build)"; return 1; }
  mkdir -p "$work/$name/corpus" "$work/$name/tmp"
  local rc=0
  # libFuzzer's own limits; UBSan aborts (built with -fno-sanitize-recover); ASan's leak check is on.
  # TMPDIR: the targets' scratch folders (fuzz_util.h) go under BUILD_DIR, not /tmp (one a target a run)
  (cd "$work/$name" && TMPDIR="$work/$name/tmp" ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:symbolize=1" \
    UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
    "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len="${max_len[$name]}" \
    -print_final_stats=1 -artifact_prefix="$work/$name/" "$work/$name/corpus" "$here/corpus/$name" \
    >"$work/$name.log" 2>&1) || rc=$?
  local runs
  runs=$(grep -o '^stat::number_of_executed_units: *[0-9]*' "$work/$name.log" | grep -o '[0-9]*$')
  local last
  last=$(grep -E '^#[0-9]+' "$work/$name.log" | tail -1)
  if ((rc != 0)); then
    echo "fuzz: $name FAILED (exit $rc) after ${seconds}s: see $work/$name.log; inputs in $work/$name/"
    grep -m3 -E 'ERROR: (AddressSanitizer|libFuzzer|LeakSanitizer)|runtime error:|SUMMARY' "$work/$name.log" | sed 's/^/  /'
    return 1
  fi
  echo "fuzz: $name ok: ${seconds}s, ${runs:-?} runs; $last"
}
export -f run_one
export build seconds work here
export max_len_decl="$(declare -p max_len)"

fail=0
summary="$(mktemp "$work/summary.XXXXXX")"
printf '%s\n' "${targets[@]}" |
  xargs -P "${FUZZ_JOBS:-2}" -I{} bash -c 'eval "$max_len_decl"; run_one "$1"' _ {} >"$summary"
grep -q FAILED "$summary" && fail=1
cat "$summary"
n_ok=$(grep -c ' ok:' "$summary")
n_bad=$(grep -c 'FAILED\|missing' "$summary")
rm -f "$summary"
echo "fuzz: ${n_ok} passed, ${n_bad} failed"
exit $fail
