"""What a deployment costs: GPU-hour prices and dollars per million tokens.

The default prices (:data:`GPU_HOUR_USD`) are one provider's public on-demand rate card, so
the kinds compare on one basis: Hyperstack's (https://www.hyperstack.cloud/gpu-pricing, rates
as published on 2026-08-26): NVIDIA H100 SXM $3.20, H200 SXM $3.99, B200 $6.00 per GPU-hour,
each VM with up to 240, 225 and 256 GB of host memory per GPU. Prices move and differ by
provider (the same H100 SXM was listed from about $2.69 to $6.88 per GPU-hour on-demand in
late 2026); give your own with ``hybridkv plan --gpu-hour-usd h100=2.49``.

Cost at the trace's load: the deployment is rented for the window the trace covers (from the
first arrival to the last, :func:`billed_seconds`), whatever it does meanwhile, and that bill
is spread over the tokens served (:func:`usd_per_mtok`). Host memory for a CPU tier is part of
the VM (above), so a tier up to :data:`HOST_GB_PER_GPU` per GPU adds nothing to the bill.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

#: On-demand USD per GPU-hour by GPU preset (module docstring for the source).
GPU_HOUR_USD: dict[str, float] = {"h100": 3.20, "h200": 3.99, "b200": 6.00}
PRICE_SOURCE = "Hyperstack on-demand rate card (hyperstack.cloud/gpu-pricing, 2026-08-26)"
#: Host memory per GPU in the smallest of the rate card's VMs above (H200: 225 GB).
HOST_GB_PER_GPU = 225.0


def price_of(gpu: str, prices: Mapping[str, float]) -> float:
    """USD per GPU-hour of ``gpu``; ValueError naming the kinds priced when it has none."""
    try:
        return prices[gpu]
    except KeyError:
        raise ValueError(f"no GPU-hour price for {gpu!r}; priced: {', '.join(sorted(prices))} "
                         f"(give one with --gpu-hour-usd {gpu}=USD)") from None


def billed_seconds(first_arrival_s: float, last_arrival_s: float) -> float:
    """Seconds a deployment is rented for a window of traffic: its arrival span."""
    if last_arrival_s < first_arrival_s:
        raise ValueError(f"last arrival {last_arrival_s} is before the first {first_arrival_s}")
    return last_arrival_s - first_arrival_s


@dataclass(frozen=True, slots=True)
class TokenCost:
    """The bill of one deployment over one window, per million tokens.

    ``usd`` is ``gpus x usd_per_gpu_hour x seconds / 3600``; ``per_mtok`` spreads it over every
    token served (prompt + output), ``per_m_input`` over the prompt tokens alone and
    ``per_m_output`` over the output tokens alone (each the price if only that kind paid)."""

    usd: float
    per_mtok: float | None
    per_m_input: float | None
    per_m_output: float | None

    def to_json(self) -> dict:
        return {"usd": self.usd, "usd_per_mtok": self.per_mtok,
                "usd_per_m_input_tok": self.per_m_input, "usd_per_m_output_tok": self.per_m_output}


def token_cost(gpus: int, usd_per_gpu_hour: float, seconds: float, prompt_tokens: int,
               output_tokens: int) -> TokenCost:
    """:class:`TokenCost` of ``gpus`` GPUs rented for ``seconds`` serving these tokens (None
    per kind of token when none was served)."""
    if gpus < 1 or usd_per_gpu_hour < 0 or seconds < 0:
        raise ValueError(f"need gpus >= 1, a price >= 0 and seconds >= 0, got {gpus}, "
                         f"{usd_per_gpu_hour}, {seconds}")
    usd = gpus * usd_per_gpu_hour * seconds / 3600.0

    def per(tokens: int) -> float | None:
        return usd / (tokens / 1e6) if tokens > 0 else None
    return TokenCost(usd, per(prompt_tokens + output_tokens), per(prompt_tokens), per(output_tokens))


def usd_per_mtok(gpus: int, usd_per_gpu_hour: float, seconds: float, tokens: int) -> float | None:
    """Dollars per million of ``tokens`` for ``gpus`` GPUs rented ``seconds``."""
    return token_cost(gpus, usd_per_gpu_hour, seconds, tokens, 0).per_mtok


__all__ = ["GPU_HOUR_USD", "HOST_GB_PER_GPU", "PRICE_SOURCE", "TokenCost", "billed_seconds",
           "price_of", "token_cost", "usd_per_mtok"]
