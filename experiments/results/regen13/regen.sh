#!/usr/bin/env bash
# section 30, for the next cycle: the shared corpus's sources and ShareGPT's first turns are spent, so regen13 answers
# ShareGPT's later user turns, each asked on its own (regen_prompts.py --turns later; 35,273 usable at 20-1,500
# characters, none a turn already answered): the first 3,500 of that shuffled list. The exclusions are files any
# machine rebuilds (the shared corpus's answers, regen3's and regen6's first-turn lists), so the list is the same
# everywhere. Section 31's regen14/regen.sh with NAME set and no PRIOR. Resumable: a rerun answers only the chunks
# outputs/regen13/regen.jsonl does not hold yet.
NAME=regen13 PRIOR= exec "$(dirname "$0")/../regen14/regen.sh"
