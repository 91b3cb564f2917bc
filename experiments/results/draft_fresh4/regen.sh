#!/usr/bin/env bash
# section 28: section 27's regen.sh for regen11, the slice after regen10's of the same shuffled lists: the rest of
# alpaca_5000 and gpteacher_roleplay (884 and 402 left), 1,000 more codegen, 1,200 more gsm8k
REGEN=regen11 \
START="alpaca_5000=2300 gpteacher_codegen=1400 gpteacher_roleplay=950 gsm8k_train=950" \
TAKE="alpaca_5000=1000 gpteacher_codegen=1000 gpteacher_roleplay=500 gsm8k_train=1200" \
exec "$(dirname "$0")/../draft_fresh3/regen.sh"
