"""The goodput model: what one replica delivers under a joint choice of caps.

Why an object: every stage prices choices against the same fleet context --
acceptance per tenant, the fleet's default acceptance, the confidence floors
in force, whether an `off` pool exists -- and only the replica and the choice
vary from question to question. `GoodputModel` holds that context (built
once per `decide()`; `with_thetas` / `replace` give the variants the floor
check and the fleet plan ask about) and answers `evaluate(rep, choice)`.

Model. Replica r runs a batch of B_r requests whose tenants have conditional
per-position acceptance a_t (see `acceptance_fit`). If tenant t may draft L_t
tokens per step and proposes in a share p_t of its steps, f_t * L_t tokens on
average (`acceptance_fit.Proposal`: measured for ngram, 1 and 1 for a trained
drafter), one engine step verifies n_r = B_r * sum_t s_rt * (1 + p_t f_t L_t)
tokens, emits B_r * sum_t s_rt * tau_t(L_t) tokens and takes T_r(B_r, n_r)
seconds (the replica's step curve with the drafter's pass; on a knob-capable
replica whose drafter skips its pass at K=0 the pass is paid by the steps that
hold a drafting request, a share 1 - (1 - w)^B of them, elsewhere by every
step). Goodput is B_r * tokens / T_r. The tenants' shares of the batch s_rt
follow from their measured shares of the replica's tokens m_rt, which the caps
do not move, and their tokens per step: s_rt ~ m_rt / tau_t(L_t) (a slower
tenant's requests hold their slots longer; `batch_shares`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from contract.policy import DEFAULT_TENANT

from ..acceptance_fit import Proposal, draft_length, method_proposal
from .views import ReplicaInput


def regime_label(rho: float) -> str:
    if rho < 0.7:
        return "memory-bound"
    if rho < 1.0:
        return "near-knee"
    return "compute-bound"


def replica_load(rep: ReplicaInput) -> float:
    """Requests on the replica: running plus waiting. A queue is the batch of
    the next seconds (a load step shows up there first, while its prompts are
    still being prefilled), so the regime is judged on it."""
    return max(rep.batch + max(rep.waiting, 0.0), 0.0)


def run_batch(rep: ReplicaInput) -> float:
    """The batch the policy will run at (`replica_load`; an idle replica counts
    as holding its next request)."""
    return max(replica_load(rep), 1.0)


def effective_cap(rep: ReplicaInput, k: int) -> int:
    """The draft cap a tenant at cap `k` actually gets on `rep`."""
    if rep.block <= 0 or k <= 0:
        return 0
    if not rep.supports_knobs:
        # Without per-request knobs the replica drafts its full block; a
        # tenant that should not speculate is steered to an `off` replica by
        # routing (preferred_profile), which the model takes as realised.
        return rep.block if k > 0 else 0
    return min(k, rep.block)


def batch_shares(token_shares: Mapping[str, float], taus: Mapping[str, float]) -> dict[str, float]:
    """Each tenant's share of a replica's running requests, from its share of the tokens.

    The mix is measured as shares of completion tokens, and that share is what a
    choice of caps leaves alone: clients draw requests (closed loop) or send them
    (open loop) at rates the caps do not set, so each tenant's tokens stay in
    proportion. Its requests' share of the batch does not: a request holds its
    slot for (its output) / (its tokens per step) steps (Little's law), so a
    tenant emitting tau_t tokens per step holds a share proportional to
    m_t / tau_t. Slowing one tenant fills the batch with its requests: with
    `code` drafting at tau 4.2 and `chat` off at 1, equal token shares put 81 %
    of the batch in chat, and the batch emits 1.6 tokens per request-step, not
    the 2.6 that equal slots would (simulated: drafting code alone beside chat
    at 0 yielded +2 % over nobody drafting, both drafting +33 %).

    The same holds with an `off` pool: a tenant at k=0 queues there instead, but
    the clients' concurrency is the fleet's, so its slower requests take their
    share of the fleet's slots wherever they run. Where each tenant instead keeps a
    fixed number of requests in flight, the requests stay in proportion: the rule
    is exact at the caps in force there only (docs/controller.md, *The decision*).
    """
    weights = {t: m / max(taus.get(t, 1.0), 1e-9) for t, m in token_shares.items()}
    total = sum(weights.values())
    return {t: w / total for t, w in weights.items()} if total > 0 else dict(token_shares)


class ReplicaEval(NamedTuple):
    goodput: float  # tokens/s the replica emits
    step_s: float  # seconds per engine step
    verify_tokens: float  # tokens per step: verified (drafts + 1) plus prefill
    taus: dict[str, float]  # tenant -> tokens emitted per step per request


@dataclass(frozen=True)
class GoodputModel:
    """Prices a joint choice of draft caps (tenant -> cap) on one replica.

    A tenant missing from a choice gets the default tenant's cap (0 if that
    is missing too); a tenant missing from `acc` gets `fleet_a`; where
    `method_acc` knows the tenant on the replica's method, that wins.
    """

    acc: Mapping[str, float]
    fleet_a: float
    thetas: Mapping[str, float | None] = field(default_factory=dict)  # tenant -> confidence floor
    off_pool: bool = False  # a k=0 tenant is routed to an `off` replica
    method_acc: Mapping[str, Mapping[str, float]] = field(default_factory=dict)  # tenant -> method -> a
    proposal: Mapping[str, Mapping[str, Proposal]] = field(default_factory=dict)  # tenant -> method -> measured

    def acceptance(self, tenant: str, method: str) -> float:
        """The tenant's acceptance on a replica of `method` (its own on that
        method when measured, else its overall estimate, else the fleet's)."""
        by_method = self.method_acc.get(tenant)
        if by_method and method in by_method:
            return by_method[method]
        return self.acc.get(tenant, self.fleet_a)

    def proposes(self, tenant: str, method: str) -> Proposal:
        """How often and how fully the tenant proposes on a replica of
        `method`: measured where it has evidence there, else the method's
        prior (a trained drafter always proposes its cap)."""
        return self.proposal.get(tenant, {}).get(method) or method_proposal(method)

    def with_thetas(self, thetas: Mapping[str, float | None]) -> GoodputModel:
        return replace(self, thetas=thetas)

    def goodput(self, rep: ReplicaInput, choice: Mapping[str, int]) -> float:
        return self.evaluate(rep, choice).goodput

    def total(self, reps: list[ReplicaInput], choice: Mapping[str, int]) -> float:
        return sum(self.evaluate(rep, choice).goodput for rep in reps)

    def _drafting_share(self, rep: ReplicaInput, weights_caps: list[tuple[float, int]],
                        batch: float) -> tuple[float, float]:
        """(share of the batch the drafter's pass covers, share of steps that run the pass).

        vLLM drafts batch-wide: on a speculative replica the drafter proposes a
        full block for every decoding request whatever the per-request caps
        (a cap of 0 saves verification, not drafting). Two ways out: with an off
        pool, a tenant at k=0 is routed there (preferred_profile="off") and
        stops costing this replica's drafter; and on a knob-capable replica
        (drafters.vllm_ext) a step whose requests are all capped at 0 runs with
        K=0, which skips the drafter's pass -- so the pass is paid while anyone
        on the replica drafts, and not at all once nobody does -- where the
        replica's drafter has a K=0 skip in force (`rep.k0_skips_pass`; EAGLE's
        first forward always runs, and an engine whose sources the plugin did not
        verify runs the stock pass): elsewhere every step pays it, as without knobs.

        "While anyone drafts" is per step: a step drafts when it holds at
        least one drafting request, which for a batch of B requests drawn
        from the mix happens with probability phi = 1 - (1 - w)^B (w: the
        drafting tenants' weight). At a deep batch phi is ~1 whenever anyone
        drafts; at light load a small tenant's drafts cost only its own steps.
        """
        drafting_weight = sum(w for w, cap in weights_caps if cap > 0)
        if self.off_pool:
            return drafting_weight, 1.0
        if rep.supports_knobs and rep.k0_skips_pass:
            drafting_weight = min(1.0, drafting_weight)
            return (1.0 if drafting_weight > 0 else 0.0), 1.0 - (1.0 - drafting_weight) ** batch
        return (1.0 if rep.block > 0 else 0.0), 1.0

    def evaluate(self, rep: ReplicaInput, choice: Mapping[str, int]) -> ReplicaEval:
        """Goodput, step time, tokens per step and per-tenant tau of `rep`.

        An idle replica is evaluated as holding one request (the next arrival).
        The drafter's pass covers the replica's whole block (DSpark drafts it in
        one parallel pass) for the share of the batch that drafts (`_drafting_share`).
        """
        batch = run_batch(rep)
        mix = rep.mix or {DEFAULT_TENANT: 1.0}
        total = sum(mix.values()) or 1.0
        default_k = choice.get(DEFAULT_TENANT, 0)
        rows = []  # (tenant, token share, a, cap, floor, proposal)
        for tenant, weight in mix.items():
            cap = effective_cap(rep, choice.get(tenant, default_k))
            rows.append((tenant, weight / total, self.acceptance(tenant, rep.method), cap, self.thetas.get(tenant),
                         self.proposes(tenant, rep.method)))

        token_shares = {t: m for t, m, *_ in rows}
        seen: dict[int, tuple[dict[str, int], dict[str, float], dict[str, float]]] = {}

        def slots(limit: int) -> tuple[dict[str, int], dict[str, float], dict[str, float]]:
            """(tenant -> draft length, -> tokens per step, -> share of the batch's requests) under a
            common verify `limit`; once per limit (the drafting share and `at_limit` ask for the block's)."""
            if limit not in seen:
                length = {t: draft_length(a, min(cap, limit), floor if rep.adaptive else None)
                          for t, _, a, cap, floor, _ in rows}
                taus = {t: proposal.tokens(a, length[t]) for t, _, a, _, _, proposal in rows}
                seen[limit] = length, taus, batch_shares(token_shares, taus)
            return seen[limit]

        at_caps = slots(rep.block)[2]
        drafting, phi = self._drafting_share(rep, [(at_caps[t], cap) for t, _, _, cap, _, _ in rows], batch)
        longest = rep.block if drafting > 0 else 0

        def step_time(n: float, extra: float = 0.0) -> float:
            """Mean step time verifying `n` tokens per step on average (plus
            `extra` prefill): a share phi of steps drafts and verifies the
            drafts, the rest verify one token per request and skip the pass."""
            if longest == 0 or phi >= 1.0:
                return rep.cost.step_time_s(batch, n + extra, longest, rep.context_tokens, batch * drafting)
            n_drafting = max(batch, (n - (1.0 - phi) * batch) / phi) if phi > 0 else n
            return phi * rep.cost.step_time_s(batch, n_drafting + extra, longest, rep.context_tokens, batch) + (
                1.0 - phi
            ) * rep.cost.step_time_s(batch, batch + extra, 0, rep.context_tokens, 0.0)

        def at_limit(limit: int) -> tuple[float, float, float, dict[str, float]]:
            length, taus, share = slots(limit)
            tokens = sum(share[t] * taus[t] for t in taus)
            verify = sum(share[t] * (1 + proposal.drafted(length[t])) for t, *_, proposal in rows)
            n = batch * verify
            prefill = rep.prefill_ratio * batch * tokens  # mean prompt tokens per step
            step = step_time(n)
            if prefill > 0:
                # Prefill arrives in chunks (a whole prompt, up to the step budget),
                # not as a smooth trickle: a fraction q of steps carries one chunk.
                # Averaging max(memory, compute) over bursty steps is what makes a
                # memory-bound decode batch slower than its mean token count says.
                chunk = max(1.0, rep.prompt_tokens)
                q = min(1.0, prefill / chunk)
                burst = step_time(n, chunk)
                step = q * burst + (1 - q) * step
            return batch * tokens / step, step, n + prefill, taus

        if not rep.adaptive or longest == 0:
            return ReplicaEval(*at_limit(longest))
        # (min_confidence floors are honoured only by -av replicas: the confidence
        # head runs only under adaptive verification.)
        # Adaptive verification: the engine drafts the caps but verifies only the
        # budget that maximises tokens per unit step time (modelled as a common
        # per-request verify limit chosen each step).
        return ReplicaEval(*max((at_limit(limit) for limit in range(longest + 1)), key=lambda r: r[0]))
