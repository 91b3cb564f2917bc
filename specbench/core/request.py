"""Requests in and results out of the decode loop."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Request:
    id: str
    prompt: str  # the user message as given
    prompt_ids: list[int]  # after the chat template (a later turn: the whole conversation so far)
    category: str | None = None
    turn: int = 1  # which user turn of its conversation (dataset.turns)
    history: tuple[tuple[str, str], ...] = ()  # the (user, answer) exchanges before this turn, answered in this run
    later: tuple[str, ...] = ()  # the conversation's user turns after this one


@dataclass
class RequestResult:
    request: Request
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str = ""  # "eos" | "stop" | "length"
    accepted_per_step: list[int] = field(default_factory=list)  # drafts accepted at each target step
    draft_lens: list[int] = field(default_factory=list)  # draft depth at each target step (chain: its length)
    draft_nodes: list[int] = field(default_factory=list)  # draft nodes the target scored at each step
    t_admit: float = 0.0  # perf_counter when its prefill started
    t_first: float = 0.0  # when its first token was known on the host
    chunk_times: list[float] = field(default_factory=list)  # host time of every later token chunk
    chunk_sizes: list[int] = field(default_factory=list)  # tokens kept from each chunk (after stop trimming)

    @property
    def num_new_tokens(self) -> int:
        return len(self.output_ids)
