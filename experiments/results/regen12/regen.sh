#!/usr/bin/env bash
# started at the end of section 29's session, for the next cycle (either drafter): section 27's regen.sh for regen12,
# the last unanswered prompts of the shared corpus's sources after regen11's slice: the rest of gpteacher_codegen
# (901) and gsm8k_train (3,304); alpaca_5000 and gpteacher_roleplay are spent. Resumable: a rerun of this script
# answers only the chunks outputs/regen12/regen.jsonl does not hold yet.
REGEN=regen12 \
START="gpteacher_codegen=2400 gsm8k_train=2150" \
TAKE="alpaca_5000=0 gpteacher_codegen=901 gpteacher_roleplay=0 gsm8k_train=3304" \
exec "$(dirname "$0")/../draft_fresh3/regen.sh"
