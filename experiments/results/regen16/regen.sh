#!/usr/bin/env bash
# section 33, for the next cycle: 3,500 more ShareGPT later user turns, each asked on its own, none in regen13-15
# and none opening like a held-out prompt: section 31's regen14/regen.sh with NAME and PRIOR set. Resumable: a rerun
# answers only the chunks outputs/regen16/regen.jsonl does not hold yet.
NAME=regen16 PRIOR="regen13 regen14 regen15" exec "$(dirname "$0")/../regen14/regen.sh"
