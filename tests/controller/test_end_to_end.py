"""End to end: gateway + HTTP sim replicas (SIMULATION of vLLM + DSpark on an
H200) + real Redis + the controller with 0.2 s ticks, driven by the real
`openai` SDK through the gateway."""

from __future__ import annotations

import asyncio

import pytest
from openai import AsyncOpenAI

from contract.policy import load_policies

from .conftest import TENANT_KEYS, running_controller
from .servers import wait_for

pytestmark = pytest.mark.slow
MODEL = "Qwen/Qwen3-8B"

# The load-step test runs its simulated H200s this many times slower than real
# time, so that the load step is compute-bound as the controller measures it.
# The controller prices steps by their wall-clock length (the step curve it
# learns from /metrics), and here one event loop carries the gateway, both
# replicas, the controller and 300 clients: every engine step also waits some
# h ms for that loop. At batch 120 the H200 model gives 8.2 ms for a step with
# speculation off and 77.4 ms for one drafting the full block (a = 0.83: 4.65
# tokens per step), so off wins in wall-clock terms only while
# 4.65 x (8.2 s + h) < 77.4 s + h, i.e. h < ~11 ms x s (s = this scale).
# Measured on a 2-core box at s = 1: 11-78 ms wall-clock steps where the model
# says 7.8 ms, i.e. h ~ 4-70 ms -- with h ~ 30-45 ms speculation really pays
# 1.6-2x at the "load step", the learned curve (flat level = model + h, slope
# from the prefill-carrying steps) says so, and the controller rightly keeps it
# on (the CI failure: gain_vs_off=1.63 at rho 2.39). At s = 6 off wins up to
# h ~ 64 ms, by more than the strong margin (15 %) up to h ~ 45 ms.
LOAD_STEP_TIME_SCALE = 6.0
# Cancelling the load's clients does not end its requests on the replicas: they
# run to their natural end (~200 tokens), at the simulation's pace, before the
# load has really dropped. So the waits for re-enabling scale with it.
DRAIN_TIMEOUT_S = 15.0 * LOAD_STEP_TIME_SCALE


def client(stack, tenant: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=stack.gateway_url + "/v1", api_key=TENANT_KEYS[tenant], max_retries=0, timeout=120)


async def ask(c: AsyncOpenAI, workload: str, max_tokens: int = 48):
    return await c.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": f"[workload={workload}] write something"}], max_tokens=max_tokens
    )


# `timing`: the controller's call two ticks after the step rests on step times it learned from the
# simulated replicas' wall clock; beside the other test workers a starved replica's small batches
# ran slow enough that drafting still priced as a gain at rho 6 (gain_vs_off 1.20), so
# scripts/test.sh runs it alone, before the parallel suite.
@pytest.mark.timing
async def test_load_step_turns_speculation_off_within_two_ticks_and_back_on(stack_factory, redis_url, redis_prefix):
    # A speculative replica and an `off` one: "off" means routing to the off
    # pool (vLLM drafts batch-wide, so a per-request cap of 0 saves only verification).
    async with stack_factory(["dspark-b8", "off"], time_scale=LOAD_STEP_TIME_SCALE) as st:
        async with running_controller(st.settings, redis_url, redis_prefix) as (ctrl, ticks):
            alpha, beta, bulk = client(st, "alpha"), client(st, "beta"), client(st, "bulk")
            for _ in range(4):
                await asyncio.gather(ask(alpha, "code"), ask(beta, "chat"))

            async def enabled(tenant):
                p = (await load_policies(st.store)).policies.get(tenant)
                return p is not None and p.enabled

            await wait_for(lambda: enabled("alpha"), 10, what="alpha enabled at low load")
            assert await enabled("beta")

            # Load step: 300 long requests -> batches deep in the compute-bound regime.
            load = [asyncio.create_task(ask(bulk, "chat", max_tokens=3000)) for _ in range(300)]
            try:
                def first_loaded_tick():
                    return next((i for i, d in enumerate(ticks) if d.replicas["sim-0"].batch >= 100), None) is not None

                await wait_for(first_loaded_tick, 30, what="controller to see the load step")
                i0 = next(i for i, d in enumerate(ticks) if d.replicas["sim-0"].batch >= 100)
                await wait_for(lambda: len(ticks) >= i0 + 2, 10, what="two ticks after the load step")
                for tenant in ("alpha", "beta"):
                    states = [ticks[j].policies[tenant].enabled for j in (i0, i0 + 1)]
                    assert states[-1] is False, (tenant, states, ticks[i0 + 1].policies[tenant].reason)
                    assert ticks[i0 + 1].policies[tenant].preferred_profile == "off"
                assert ticks[i0 + 1].replicas["sim-0"].regime == "compute-bound"
                # The gateway applies it: alpha's next request carries max_draft=0 -> nothing drafted.
                gw = st.app.state.gateway
                await wait_for(lambda: not gw.policies.for_tenant("alpha").enabled, 5, what="gateway to apply")
                resp = await ask(alpha, "code", max_tokens=16)
                spec = (resp.model_extra.get("metrics") or {}).get("speculative_decoding") or {}
                assert spec.get("num_draft_tokens", 0) == 0, spec
            finally:
                for t in load:
                    t.cancel()
                await asyncio.gather(*load, return_exceptions=True)

            # Load drops -> speculation back on (after dwell + confirmation).
            try:
                await wait_for(lambda: enabled("alpha"), DRAIN_TIMEOUT_S, what="alpha re-enabled after the load dropped")
            except AssertionError:
                for d in ticks[-30::3]:
                    print(d.replicas["sim-0"].batch, d.replicas["sim-0"].rho, d.policies["alpha"].reason)
                raise
            # beta (chat-like, lower acceptance) needs more evidence than alpha to clear the on margin.
            await wait_for(lambda: enabled("beta"), DRAIN_TIMEOUT_S, what="beta re-enabled after the load dropped")
            history = await st.store.recent("controller:history", 50)
            assert any(h["tenant"] == "alpha" and not h["policy"]["enabled"] for h in history)
            assert all(h["reason"] for h in history)


# Why beta runs the `creative` workload (a weak drafter: acceptance falls fast
# along the block) and not `chat`: between code (a ~0.82) and chat (a ~0.73) the
# H200 model's goodput separates the two tenants' best caps by 5-7 % at this
# batch (B=6: alpha full / beta 8 is 7 % above both at 8), inside the
# hysteresis margin and the wall-clock step noise of a shared 2-core box; CI
# saw both settle at 8 for a whole minute, which is the controller rightly not
# chasing a gain that small. Against `creative` beta's shorter cap is worth
# ~25 % (measured: "k full->4: predicted goodput +24.6% (strong)").
async def test_per_tenant_tuning_settles_on_different_draft_lengths(stack_factory, redis_url, redis_prefix):
    async with stack_factory(["dspark-b16"]) as st:
        async with running_controller(st.settings, redis_url, redis_prefix) as (ctrl, ticks):
            alpha, beta = client(st, "alpha"), client(st, "beta")
            stop = asyncio.Event()

            async def loop(c, workload):
                while not stop.is_set():
                    await ask(c, workload, max_tokens=64)

            workers = [asyncio.create_task(loop(alpha, "code")) for _ in range(3)]
            workers += [asyncio.create_task(loop(beta, "creative")) for _ in range(3)]
            try:
                def length(policy, batch: float) -> int:
                    """What the policy drafts in a step of today's batch (a schedule's length
                    there; None = no cap = the replica's whole block, 16)."""
                    k = policy.cap_at(max(1, round(batch)))
                    return 16 if k is None else min(k, 16)

                async def settled():
                    ps = (await load_policies(st.store)).policies
                    a, b = ps.get("alpha"), ps.get("beta")
                    batch = ticks[-1].replicas["sim-0"].batch if ticks else 1.0
                    return a and b and a.enabled and b.enabled and length(a, batch) > length(b, batch)

                streak = 0

                async def settled_for_3s():
                    nonlocal streak
                    streak = streak + 1 if await settled() else 0
                    return streak >= 15  # 15 consecutive checks, 0.2 s apart

                try:
                    await wait_for(settled_for_3s, 60, interval_s=0.2,
                                   what="code-like tenant to settle on a longer draft than the weak-drafter one")
                except AssertionError:
                    for d in ticks[-60::4]:
                        print(round(d.replicas["sim-0"].batch, 1), [(r.tenant, r.policy.schedule, r.policy.min_confidence,
                               r.reason[:90]) for r in d.records if r.tenant in ("alpha", "beta")])
                    raise
            finally:
                stop.set()
                await asyncio.gather(*workers, return_exceptions=True)
            alpha_rec = ticks[-1].records
            acc = {r.tenant: r.numbers["acceptance"] for r in alpha_rec}
            assert acc["alpha"] > acc["beta"]
