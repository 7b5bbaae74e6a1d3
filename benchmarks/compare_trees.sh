#!/usr/bin/env bash
# Benchmarks of two revisions of this repository, alternated in one session on one machine, so that their figures
# can be compared despite a shared machine's load:  benchmarks/compare_trees.sh BEFORE AFTER [ROUNDS]
# Each revision is checked out in a temporary git worktree and run with this checkout's .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
before=${1:?usage: benchmarks/compare_trees.sh BEFORE AFTER [ROUNDS]}
after=${2:?usage: benchmarks/compare_trees.sh BEFORE AFTER [ROUNDS]}
rounds=${3:-2}
python=$PWD/.venv/bin/python
work=$(mktemp -d)
trap 'git worktree remove --force "$work/before" 2>/dev/null; git worktree remove --force "$work/after" 2>/dev/null; rm -rf "$work"' EXIT
git worktree add -q --detach "$work/before" "$before"
git worktree add -q --detach "$work/after" "$after"
for round in $(seq "$rounds"); do
  for tree in before after; do
    echo "=== round $round $tree ($(git -C "$work/$tree" rev-parse --short HEAD)) bench_flow; $(uptime)"
    (cd "$work/$tree" && PYTHONPATH=$PWD MPLBACKEND=Agg "$python" benchmarks/bench_flow.py | grep -E '^\| |goal')
    echo "=== round $round $tree bench_reestimate; $(uptime)"
    (cd "$work/$tree" && PYTHONPATH=$PWD MPLBACKEND=Agg "$python" benchmarks/bench_reestimate.py --repeats 2 \
       --flow-repeats 2 --m 1000 100000 --rows 5000 | grep -E '^\| |^#|ratio')
  done
done
