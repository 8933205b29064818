"""Benchmark workloads: which requests arrive when, with which prompt and reply length.

Everything here is deterministic for a given seed (``random.Random``, whose sequence is stable across Python
versions for ``random()``/``gauss()``/``expovariate()``), needs no model, and is unit-tested.

Two workloads:

* ``uniform`` -- N requests all arriving at t=0, each with a distinct prompt of exactly ``prompt_len``
  tokens and exactly ``max_new_tokens`` new tokens (EOS ignored). Measures raw batching throughput.
* ``realistic`` -- Poisson arrivals (exponential inter-arrival gaps, rate in requests/s), prompt and
  reply lengths drawn from clipped log-normal distributions (chat traffic is heavy-tailed; see the
  ShareGPT-based workloads used by vLLM's ``benchmark_serving``). EOS is ignored so each reply has
  exactly the drawn length.

Prompts are windows of a fixed built-in English corpus (tokenized once, repeated as needed), each starting
at a different offset so that no two prompts share a prefix (no prefix-cache effects).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass

# A fixed corpus of plain English prose, written for this benchmark. Only its token ids matter.
CORPUS = """\
The harbour town woke slowly. Fishing boats came in before dawn, their decks stacked with crates of silver \
fish, and the gulls followed them all the way to the quay. By seven the bakery on the corner had sold its \
first tray of bread, and the old clock above the town hall, which had been wrong for as long as anyone could \
remember, announced that it was a quarter past nine.

Photosynthesis is the process by which green plants turn light into chemical energy. Inside each leaf, \
chloroplasts absorb sunlight and use it to split water molecules, releasing oxygen as a by-product. The energy \
captured this way is stored in sugars, which the plant uses to grow roots, stems, flowers and seeds. Nearly \
every food chain on land begins with this quiet, continuous work.

When you write a function, give it one clear job. A function that parses a date should not also send an \
email, and a function that sends an email should not decide what the email says. Small functions with honest \
names are easier to test, easier to reuse and easier to delete when they are no longer needed. Most bugs hide \
in the places where a function does two things at once.

The expedition left base camp in the second week of April. For nine days the weather held, and the climbers \
moved steadily up the glacier, fixing ropes across the crevasses and resting in the afternoons when the snow \
grew soft. On the tenth day a storm came in from the west. They waited it out in their tents, melting snow for \
tea and reading the same three paperbacks over and over.

A good soup starts with a good stock. Roast the bones until they are deep brown, then cover them with cold \
water, add an onion, a carrot, a stick of celery and a few peppercorns, and let the pot barely simmer for \
several hours. Skim the surface now and then. Strain it, cool it quickly, and lift off the fat once it has set. \
The stock will keep for a few days in the refrigerator or for months in the freezer.

Interest compounds when the interest you earn is added to the balance and itself begins to earn interest. \
Over a year the difference is small, but over thirty years it is enormous: a sum growing at five percent a \
year roughly doubles every fourteen years. The same arithmetic works against you when you borrow, which is why \
credit card debt that is left unpaid can grow faster than most people expect.

The museum's newest room holds a single object: a wooden chair, plain and slightly crooked, that belonged to \
a village schoolteacher two hundred years ago. Visitors are often puzzled at first. Then they read the letters \
displayed on the wall beside it, written by former pupils who became doctors, sailors, farmers and poets, and \
each of them mentions the chair.

Rivers shape the land they cross. In their steep upper reaches they cut narrow valleys and carry boulders \
downstream during floods. Lower down, where the slope eases, they slow and wander, dropping sand and silt on \
the inside of each bend and eating into the outside. Over centuries a meander can close on itself and leave \
behind a curved lake, cut off from the river that made it.

To learn a language as an adult, listen more than you think you need to. Read simple stories aloud, copy \
the rhythm of native speakers, and do not be embarrassed by mistakes. Vocabulary grows fastest when words are \
met many times in different sentences, so a little practice every day beats a long session once a week. \
Above all, find something you actually want to say.

The night train to the coast was almost empty. A conductor walked the corridor once an hour, checking \
tickets that had already been checked, and the dining car served tea in heavy white cups that rattled on \
their saucers whenever the train crossed a junction. Outside, small stations slid past in the dark, each one \
lit by a single lamp and named on a sign that nobody was awake to read.
"""


@dataclass(frozen=True)
class Request:
    """One benchmark request.

    ``arrival_s`` is the arrival time in seconds after the run's start (t0); ``max_new_tokens`` is the exact
    number of tokens the reply must have (EOS is ignored by every system).
    """

    rid: int
    arrival_s: float
    prompt_token_ids: tuple[int, ...]
    max_new_tokens: int

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["prompt_token_ids"] = list(self.prompt_token_ids)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Request:
        return cls(
            rid=int(d["rid"]),
            arrival_s=float(d["arrival_s"]),
            prompt_token_ids=tuple(int(t) for t in d["prompt_token_ids"]),
            max_new_tokens=int(d["max_new_tokens"]),
        )


@dataclass(frozen=True)
class Workload:
    """A named list of requests, sorted by arrival time (ties broken by ``rid``)."""

    name: str
    requests: tuple[Request, ...]
    params: dict

    @property
    def n(self) -> int:
        return len(self.requests)

    @property
    def total_new_tokens(self) -> int:
        return sum(r.max_new_tokens for r in self.requests)

    @property
    def label(self) -> str:
        return f"{self.name}/N={self.n}"

    def to_dict(self) -> dict:
        return {"name": self.name, "params": self.params, "requests": [r.to_dict() for r in self.requests]}

    @classmethod
    def from_dict(cls, d: dict) -> Workload:
        return cls(d["name"], tuple(Request.from_dict(r) for r in d["requests"]), dict(d["params"]))


def corpus_token_ids(tokenizer) -> list[int]:
    """Token ids of :data:`CORPUS` (no special tokens). ``tokenizer`` is any HF-style tokenizer."""
    ids = tokenizer(CORPUS, add_special_tokens=False)["input_ids"]
    if len(ids) < 64:
        raise ValueError(f"corpus tokenized to only {len(ids)} tokens")
    return list(ids)


def distinct_offsets(n: int, period: int, rng: random.Random) -> list[int]:
    """``n`` start offsets into a cyclic corpus of ``period`` tokens, distinct modulo ``period`` when possible.

    Offsets are spread evenly over the corpus (so prompts are as different as possible) and then shuffled.
    """
    if n <= 0:
        return []
    if n <= period:
        step = period / n
        offsets = [int(i * step) for i in range(n)]
    else:  # more prompts than corpus positions: repeat (only happens for tiny test corpora)
        offsets = [i % period for i in range(n)]
    rng.shuffle(offsets)
    return offsets


def window(corpus_ids: Sequence[int], offset: int, length: int) -> tuple[int, ...]:
    """``length`` tokens of the corpus starting at ``offset``, wrapping around cyclically."""
    period = len(corpus_ids)
    return tuple(corpus_ids[(offset + i) % period] for i in range(length))


def lognormal_clipped(rng: random.Random, median: float, sigma: float, lo: int, hi: int) -> int:
    """One integer draw from a log-normal with the given median and log-space sigma, clipped to [lo, hi]."""
    x = median * math.exp(rng.gauss(0.0, sigma))
    return int(min(hi, max(lo, round(x))))


def poisson_arrivals(n: int, rate: float, rng: random.Random) -> list[float]:
    """Arrival times (s) of a Poisson process with ``rate`` requests/s; the first request arrives at t=0.

    ``rate <= 0`` or ``inf`` means everything arrives at t=0.
    """
    if n <= 0:
        return []
    if rate <= 0 or math.isinf(rate):
        return [0.0] * n
    t, out = 0.0, [0.0]
    for _ in range(n - 1):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def uniform_workload(
    corpus_ids: Sequence[int], n: int, prompt_len: int = 128, max_new_tokens: int = 128, seed: int = 0
) -> Workload:
    """``n`` requests at t=0, distinct prompts of exactly ``prompt_len`` tokens, exactly ``max_new_tokens``."""
    rng = random.Random(f"uniform:{seed}:{n}")
    offsets = distinct_offsets(n, len(corpus_ids), rng)
    reqs = tuple(
        Request(
            rid=i,
            arrival_s=0.0,
            prompt_token_ids=window(corpus_ids, off, prompt_len),
            max_new_tokens=max_new_tokens,
        )
        for i, off in enumerate(offsets)
    )
    params = {"n": n, "prompt_len": prompt_len, "max_new_tokens": max_new_tokens, "seed": seed}
    return Workload("uniform", reqs, params)


@dataclass(frozen=True)
class RealisticParams:
    """Parameters of the realistic workload. Lengths are in tokens, ``rate`` in requests/s."""

    num_requests: int = 48
    # Near this 2-core machine's capacity with our engine (at 1 req/s it only waits for arrivals).
    rate: float = 2.0
    prompt_median: float = 200.0
    prompt_sigma: float = 0.9
    prompt_min: int = 20
    prompt_max: int = 1000
    reply_median: float = 96.0
    reply_sigma: float = 0.8
    reply_min: int = 16
    reply_max: int = 512
    seed: int = 0


def realistic_workload(corpus_ids: Sequence[int], p: RealisticParams) -> Workload:
    """Poisson arrivals with log-normal (clipped) prompt and reply lengths; see :class:`RealisticParams`.

    Lengths and arrivals come from separate seeded streams, so changing ``rate`` leaves every request's
    prompt and reply unchanged (only the arrival times scale).
    """
    len_rng = random.Random(f"realistic-lengths:{p.seed}")
    arr_rng = random.Random(f"realistic-arrivals:{p.seed}")
    off_rng = random.Random(f"realistic-offsets:{p.seed}")
    n = p.num_requests
    prompt_lens = [
        lognormal_clipped(len_rng, p.prompt_median, p.prompt_sigma, p.prompt_min, p.prompt_max)
        for _ in range(n)
    ]
    reply_lens = [
        lognormal_clipped(len_rng, p.reply_median, p.reply_sigma, p.reply_min, p.reply_max) for _ in range(n)
    ]
    # Unit-rate arrivals scaled by 1/rate: the same seed gives the same pattern, stretched or squeezed.
    unit = poisson_arrivals(n, 1.0, arr_rng)
    arrivals = [t / p.rate for t in unit] if p.rate > 0 and not math.isinf(p.rate) else [0.0] * n
    offsets = distinct_offsets(n, len(corpus_ids), off_rng)
    reqs = tuple(
        Request(
            rid=i,
            arrival_s=round(arrivals[i], 6),
            prompt_token_ids=window(corpus_ids, offsets[i], prompt_lens[i]),
            max_new_tokens=reply_lens[i],
        )
        for i in range(n)
    )
    return Workload("realistic", reqs, asdict(p))
