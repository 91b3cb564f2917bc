#!/usr/bin/env bash
# section 32, for the next cycle: 3,500 more ShareGPT later user turns, each asked on its own, none in regen13 or
# regen14 (their prompt lists, rebuilt by the script, are excluded): section 31's regen14/regen.sh with NAME and
# PRIOR set. Resumable: a rerun answers only the chunks outputs/regen15/regen.jsonl does not hold yet.
NAME=regen15 PRIOR="regen13 regen14" exec "$(dirname "$0")/../regen14/regen.sh"
