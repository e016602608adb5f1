#!/usr/bin/env bash
# Mutation testing of one module, run by hand (not part of CI):
#   scripts/mutation.sh MODULE [N] [--seed S] [--timeout SECONDS] [--keep] [options]
# MODULE is kernels/cpu, cache, transport or common. Samples N mutants (default
# 80, seed 1) of the module's source files, builds each in a scratch copy of the
# tree, runs only the module's unit tests and prints the mutation score and the
# surviving mutants; --help lists every option. Needs universalmutator's
# `mutate` on PATH or in $MUTATE:
#   python3 -m venv ~/.venvs/mutenv && ~/.venvs/mutenv/bin/pip install universalmutator
#   export MUTATE=~/.venvs/mutenv/bin/mutate
# docs/testing.md describes what it measures and the scores so far.
set -euo pipefail
exec python3 "$(dirname "$0")/mutation.py" "$@"
