"""What speculative decoding means for the KV cache.

Three independent effects, all derived here from the method and k (speculative tokens):

==========================  ======  ======  =====  =======  ===========  =====
effect                      eagle   eagle3  mtp    dflash   draft_model  ngram
==========================  ======  ======  =====  =======  ===========  =====
lookahead slots              k       k       k     **k+1**  k            0
boundary proof needed        yes     yes     yes   no       no           no
==========================  ======  ======  =====  =======  ===========  =====

* **Lookahead slots** are KV slots allocated past the scheduled tokens for draft tokens (on the
  first prefill too). They are never hashed nor cached. DFlash needs one more: its drafter runs
  one bonus query plus one query per draft token.
* **Boundary proof**: an EAGLE/MTP drafter's KV at a block's last position was computed from the
  *next* token, which a plain block hash does not cover. Two ways to stay correct:

  - *lookahead hashing* (default): each block hash also covers the next token (L = 1), so a hit
    proves the token and nothing is dropped;
  - *drop mode* (vLLM's legacy EAGLE semantics, ``hash_lookahead=False``): a hit at t must also
    find the block that follows t (one block of each draft group) cached, then serves t.
"""

from __future__ import annotations

from dataclasses import dataclass

SPEC_METHODS = ("eagle", "eagle3", "mtp", "dflash", "draft_model", "ngram")
_PROOF_METHODS = frozenset({"eagle", "eagle3", "mtp"})


@dataclass(frozen=True, slots=True)
class SpecDecode:
    """A speculative-decoding configuration.

    Args:
        method: one of :data:`SPEC_METHODS`.
        num_speculative_tokens: k >= 1 draft tokens per step.
        hash_lookahead: for EAGLE/EAGLE3/MTP, prove the boundary token in the hash (True,
            default) or drop-and-verify one block like vLLM's legacy mode (False).
        drafter_window: DFlash only: the drafter's KV sliding window in tokens; it must cover
            the step's k+1 queries (the bonus token counts).
    """

    method: str
    num_speculative_tokens: int
    hash_lookahead: bool | None = None
    drafter_window: int | None = None

    def __post_init__(self) -> None:
        if self.method not in SPEC_METHODS:
            raise ValueError(
                f"unknown speculative method {self.method!r}; valid: {', '.join(SPEC_METHODS)}"
            )
        k = self.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"num_speculative_tokens must be an integer >= 1, got {k!r}")
        if self.hash_lookahead is None:
            object.__setattr__(self, "hash_lookahead", self.method in _PROOF_METHODS)
        elif self.hash_lookahead and self.method not in _PROOF_METHODS:
            raise ValueError(
                f"hash_lookahead applies to eagle, eagle3 and mtp only, not {self.method!r}"
            )
        if self.drafter_window is not None:
            if self.method != "dflash":
                raise ValueError(f"drafter_window applies to dflash only, not {self.method!r}")
            self.check_drafter_window(self.drafter_window)

    @property
    def lookahead_slots(self) -> int:
        """KV slots reserved past the scheduled tokens every step (never cached)."""
        if self.method == "ngram":
            return 0
        k = self.num_speculative_tokens
        return k + 1 if self.method == "dflash" else k

    @property
    def needs_boundary_proof(self) -> bool:
        return self.method in _PROOF_METHODS

    @property
    def hash_lookahead_tokens(self) -> int:
        """L, the tokens after a block that its hash covers (0 or 1)."""
        return 1 if self.needs_boundary_proof and self.hash_lookahead else 0

    @property
    def drops_last_block(self) -> bool:
        """Drop mode: draft groups must find the block after a hit cached (vLLM legacy)."""
        return self.needs_boundary_proof and not self.hash_lookahead

    def check_drafter_window(self, window: int) -> None:
        """Raise unless a DFlash drafter window covers one step's k draft queries + the bonus."""
        need = self.num_speculative_tokens + 1
        if isinstance(window, bool) or not isinstance(window, int) or window < need:
            raise ValueError(
                f"dflash drafter_window {window!r} is too small for k={self.num_speculative_tokens}: "
                f"one step queries k draft positions plus the bonus token, so the window must be "
                f">= {need}"
            )


SPEC_OFF = "none"
_METHOD_ALIASES = {"draft": "draft_model", "draft-model": "draft_model", "draftmodel": "draft_model"}


def parse_spec(text: str) -> SpecDecode | None:
    """The one grammar of speculative decoding on a command line or in a string option.

    ``METHOD:K`` -> ``SpecDecode(METHOD, K)``, where METHOD is one of :data:`SPEC_METHODS`
    (case-insensitive; ``draft`` and ``draft-model`` mean ``draft_model``) and K >= 1 is the
    number of draft tokens per step, e.g. ``eagle:3``, ``mtp:1``, ``dflash:7``, ``ngram:4``.
    ``none`` -> None (no speculative decoding).

    Raises:
        ValueError: naming the text and what is valid (the grammar, the methods, K's range).
    """
    if not isinstance(text, str):
        raise ValueError(f"speculative decoding is a string METHOD:K or 'none', got {text!r}")
    if text.strip().lower() == SPEC_OFF:
        return None
    method, sep, k = text.partition(":")
    method = method.strip().lower()
    method = _METHOD_ALIASES.get(method, method)
    if not sep:
        raise ValueError(f"speculative decoding is METHOD:K (methods: {', '.join(SPEC_METHODS)}; "
                         f"K >= 1 draft tokens per step) or 'none', got {text!r}")
    try:
        num = int(k.strip())
    except ValueError:
        raise ValueError(f"speculative decoding {text!r}: K must be an integer >= 1, got {k.strip()!r}") from None
    return SpecDecode(method, num)
