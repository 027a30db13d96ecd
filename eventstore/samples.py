"""Deterministic sample sessions: action lists in the wire shape (docs/format.md).

Everything here is plain data (``list[dict]``) built from a seeded :class:`random.Random`,
so the same arguments always give byte-identical actions. Benchmarks, the CLI demo and
the storage tests use these generators; they never touch a clock, uuid or the network.

- :func:`chat_session` — a long, regular chat (≈ 86 events per turn) for benchmarks.
- :func:`demo_conversation` — a short shopping-assistant conversation that exercises
  every kind of action (reasoning, tool calls, confirmation, a sub-agent, an error, a retry).
- :func:`random_actions` — random but well-formed actions for randomized store tests.
"""

from __future__ import annotations

import random
from typing import Any

__all__ = ["chat_session", "demo_conversation", "random_actions"]

_WORDS = (
    "the a mug cart order price stoneware coffee gift card shipping delivery size colour "
    "blue white matte glossy dishwasher safe handle ceramic set two four twelve ounce "
    "available stock today tomorrow free return warranty sister birthday budget total "
    "discount code checkout address pickup store nearby option recommend popular rating"
).split()

_TOOLS = ("search_products", "add_to_cart", "check_stock", "get_shipping_quote", "apply_coupon")


def _part(part: dict[str, Any], within: str | None = None) -> dict[str, Any]:
    action: dict[str, Any] = {"type": "part", "part": part}
    if within is not None:
        action["within"] = within
    return action


def _deltas(rng: random.Random, message_id: str, n: int) -> list[dict[str, Any]]:
    # Real models stream sub-word chunks of uneven size; a mix of words and fragments
    # keeps the text lengths (and so the decode cost) realistic.
    out = []
    for k in range(n):
        word = rng.choice(_WORDS)
        if rng.random() < 0.25:
            word = word[: rng.randint(1, len(word))]
        text = word if k == 0 else " " + word
        if rng.random() < 0.08:
            text += "."
        out.append(_part({"type": "text-delta", "messageId": message_id, "text": text}))
    return out


def chat_session(turns: int, seed: int = 0, *, deltas: int = 40) -> list[dict[str, Any]]:
    """A long, realistic chat as actions: the benchmark workload.

    Each turn is a ``send``, a ``message-start`` with about ``deltas`` text deltas, a
    ``tool-call`` and its ``tool-result``, a second assistant message with about ``deltas``
    deltas, and a ``finish`` — ``2 * deltas + 6`` events (86 with the default), so 50
    turns give ≈ 4,300 events.

    Args:
        turns: number of user turns.
        seed: seed of the random generator; the same seed gives the same actions.
        deltas: text deltas per assistant message (varied by ±10% per message).

    Returns:
        The actions as plain dicts in the wire shape (docs/format.md).
    """
    rng = random.Random(seed)
    actions: list[dict[str, Any]] = []
    for t in range(1, turns + 1):
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 14)))
        actions.append({"type": "send", "id": f"u-{t}", "text": words.capitalize() + "?"})
        spread = max(0, deltas // 10)
        first, second = f"a-{t}-1", f"a-{t}-2"
        actions.append(_part({"type": "message-start", "messageId": first}))
        actions.extend(_deltas(rng, first, deltas + rng.randint(-spread, spread)))
        tool = rng.choice(_TOOLS)
        call = f"call-{t}"
        actions.append(
            _part(
                {
                    "type": "tool-call",
                    "messageId": first,
                    "id": call,
                    "name": tool,
                    "input": {"query": rng.choice(_WORDS), "limit": rng.randint(1, 10)},
                }
            )
        )
        actions.append(
            _part(
                {
                    "type": "tool-result",
                    "id": call,
                    "output": {
                        "content": [{"type": "text", "text": f"{rng.randint(0, 40)} results"}],
                        "ok": True,
                    },
                }
            )
        )
        actions.append(_part({"type": "message-start", "messageId": second}))
        actions.extend(_deltas(rng, second, deltas + rng.randint(-spread, spread)))
        actions.append(_part({"type": "finish", "reason": "stop"}))
    return actions


def _say(message_id: str, text: str, within: str | None = None) -> list[dict[str, Any]]:
    # Split like a streaming model would: a few words per delta.
    words = text.split(" ")
    chunks = [" ".join(words[i : i + 3]) for i in range(0, len(words), 3)]
    return [
        _part(
            {"type": "text-delta", "messageId": message_id, "text": c if i == 0 else " " + c},
            within,
        )
        for i, c in enumerate(chunks)
    ]


def demo_conversation() -> list[dict[str, Any]]:
    """A short shopping-assistant conversation that shows every feature of the reducer.

    Turn 1 (mugs): reasoning, a product search, an ``add_to_cart`` call that waits for the
    user's confirmation (``toolPhase``) and then completes. Turn 2 (gift card): a
    ``delegate_to_gift_advisor`` call whose sub-agent streams its own nested run
    (``within``), then a ``checkout`` call interrupted by a network ``error``; the user
    retries, and the assistant finishes the checkout.

    Returns:
        About 60 actions as plain dicts in the wire shape (docs/format.md).
    """
    a: list[dict[str, Any]] = []
    a.append({"type": "send", "id": "u-1", "text": "I need two coffee mugs, dishwasher safe."})
    a.append(_part({"type": "message-start", "messageId": "a-1"}))
    a.append(
        _part(
            {
                "type": "reasoning",
                "messageId": "a-1",
                "text": "The user wants 2 dishwasher-safe mugs. Search, then add to cart.",
            }
        )
    )
    a += _say("a-1", "Let me look for dishwasher-safe mugs.")
    a.append(
        _part(
            {
                "type": "tool-call",
                "messageId": "a-1",
                "id": "call-1",
                "name": "search_products",
                "input": {"query": "coffee mug", "dishwasherSafe": True},
            }
        )
    )
    a.append(
        _part(
            {
                "type": "tool-result",
                "id": "call-1",
                "output": {
                    "results": [
                        {"slug": "stoneware-mug", "name": "Stoneware Mug", "price": 14.0},
                        {"slug": "enamel-mug", "name": "Enamel Camp Mug", "price": 11.5},
                    ]
                },
            }
        )
    )
    a += _say("a-1", "The Stoneware Mug ($14) fits. I'll add two to your cart.")
    a.append(
        _part(
            {
                "type": "tool-call",
                "messageId": "a-1",
                "id": "call-2",
                "name": "add_to_cart",
                "input": {"slug": "stoneware-mug", "qty": 2},
            }
        )
    )
    a.append(
        {
            "type": "toolPhase",
            "name": "add_to_cart",
            "state": "awaiting-confirmation",
            "prompt": "Add 2 × Stoneware Mug ($28.00) to your cart?",
        }
    )
    a.append({"type": "toolPhase", "name": "add_to_cart", "state": "running"})
    a.append(
        _part(
            {
                "type": "tool-result",
                "id": "call-2",
                "output": {"cart": {"items": 2, "total": 28.0}},
            }
        )
    )
    a += _say("a-1", "Done: two Stoneware Mugs are in your cart ($28.00).")
    a.append(_part({"type": "step-finish"}))
    a.append(_part({"type": "finish", "reason": "stop"}))

    a.append({"type": "send", "id": "u-2", "text": "Also a gift card for my sister, then check out."})
    a.append(_part({"type": "message-start", "messageId": "a-2"}))
    a += _say("a-2", "I'll ask our gift advisor.")
    a.append(
        _part(
            {
                "type": "tool-call",
                "messageId": "a-2",
                "id": "call-3",
                "name": "delegate_to_gift_advisor",
                "input": {"recipient": "sister", "budget": 50},
            }
        )
    )
    # The sub-agent's own run, nested under call-3.
    a.append(_part({"type": "message-start", "messageId": "g-1"}, "call-3"))
    a.append(
        _part(
            {"type": "reasoning", "messageId": "g-1", "text": "Budget 50; list gift cards."},
            "call-3",
        )
    )
    a.append(
        _part(
            {
                "type": "tool-call",
                "messageId": "g-1",
                "id": "call-3a",
                "name": "list_gift_cards",
                "input": {"max": 50},
            },
            "call-3",
        )
    )
    a.append(
        _part(
            {"type": "tool-result", "id": "call-3a", "output": {"cards": [25, 50]}},
            "call-3",
        )
    )
    a += _say("g-1", "A $50 card with a birthday design is the best fit.", "call-3")
    a.append(_part({"type": "finish", "reason": "stop"}, "call-3"))
    a.append(
        _part(
            {
                "type": "tool-result",
                "id": "call-3",
                "output": {"recommendation": {"slug": "gift-card-50", "design": "birthday"}},
            }
        )
    )
    a += _say("a-2", "The advisor suggests a $50 birthday gift card. Checking out now.")
    a.append(
        _part(
            {
                "type": "tool-call",
                "messageId": "a-2",
                "id": "call-4",
                "name": "checkout",
                "input": {"items": ["stoneware-mug", "stoneware-mug", "gift-card-50"]},
            }
        )
    )
    # The connection drops while checkout runs: call-4 is cancelled, the run fails.
    a.append(
        _part({"type": "error", "error": "Couldn't reach the assistant.", "code": "network"})
    )
    # Retry resumes after the last finished call (call-3): the checkout starts over.
    a.append({"type": "retry"})
    a.append(_part({"type": "message-start", "messageId": "a-3"}))
    a.append(
        _part(
            {
                "type": "tool-call",
                "messageId": "a-3",
                "id": "call-5",
                "name": "checkout",
                "input": {"items": ["stoneware-mug", "stoneware-mug", "gift-card-50"]},
            }
        )
    )
    a.append(
        _part(
            {
                "type": "tool-result",
                "id": "call-5",
                "output": {"order": "A-1042", "total": 78.0},
            }
        )
    )
    a += _say("a-3", "Your order A-1042 is placed: two mugs and a $50 gift card, $78.00 in total.")
    a.append(_part({"type": "finish", "reason": "stop"}))
    return a


_ERROR_CODES = ("chat_disabled", "rate_limited", "bad_request", "network")


def _json_value(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if depth >= 2 or roll < 0.5:
        return rng.choice([None, True, False, rng.randint(-5, 99), rng.random(), rng.choice(_WORDS)])
    if roll < 0.75:
        return [_json_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(_WORDS): _json_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def random_actions(rng: random.Random, n: int) -> list[dict[str, Any]]:
    """Random but well-formed actions that exercise every branch of the reducer.

    Ids mostly refer to messages and calls that exist (so parts take effect), sometimes
    to unknown ones; parts are sometimes sent ``within`` a call, including calls of a
    nested run; ``stop``, ``retry`` and ``toolPhase`` appear regularly, ``reset`` rarely.
    Every action passes :func:`eventstore.core.reducer.parse_action`.

    Args:
        rng: the random generator (seed it for reproducible sequences).
        n: number of actions.

    Returns:
        ``n`` actions as plain dicts in the wire shape (docs/format.md).
    """
    # Message ids per run: None is the top-level run, a call id is that call's nested run.
    runs: dict[str | None, list[str]] = {None: []}
    calls: list[tuple[str, str]] = []  # (call id, tool name)
    counter = 0
    out: list[dict[str, Any]] = []

    def fresh(prefix: str) -> str:
        nonlocal counter
        counter += 1
        return f"{prefix}-{counter}"

    for _ in range(n):
        roll = rng.random()
        if roll < 0.08:
            out.append({"type": "send", "id": fresh("u"), "text": rng.choice(_WORDS)})
            continue
        if roll < 0.11:
            out.append({"type": "stop"})
            continue
        if roll < 0.14:
            out.append({"type": "retry"})
            continue
        if roll < 0.15:
            out.append({"type": "reset"})
            continue
        if roll < 0.21:
            name = rng.choice([c[1] for c in calls] or list(_TOOLS[:2])) if rng.random() < 0.9 else "nope"
            action: dict[str, Any] = {
                "type": "toolPhase",
                "name": name,
                "state": rng.choice(["running", "awaiting-confirmation"]),
            }
            if rng.random() < 0.5:
                action["prompt"] = "Confirm " + rng.choice(_WORDS) + "?"
            out.append(action)
            continue
        # A stream part, top-level or nested.
        within: str | None = None
        if calls and rng.random() < 0.3:
            within = rng.choice(calls)[0] if rng.random() < 0.95 else "call-unknown"
        run = runs.setdefault(within, [])
        kind = rng.random()
        if kind < 0.15 or not run:
            mid = fresh("m")
            run.append(mid)
            part: dict[str, Any] = {"type": "message-start", "messageId": mid}
        else:
            mid = rng.choice(run[-3:]) if rng.random() < 0.95 else "m-unknown"
            if kind < 0.45:
                part = {"type": "text-delta", "messageId": mid, "text": rng.choice(_WORDS) + " "}
            elif kind < 0.52:
                part = {"type": "reasoning", "messageId": mid, "text": rng.choice(_WORDS)}
            elif kind < 0.64:
                cid, name = fresh("call"), rng.choice(_TOOLS[:3])
                calls.append((cid, name))
                part = {
                    "type": "tool-call",
                    "messageId": mid,
                    "id": cid,
                    "name": name,
                    "input": _json_value(rng),
                }
            elif kind < 0.74:
                cid = rng.choice(calls)[0] if calls else "call-unknown"
                part = {"type": "tool-result", "id": cid, "output": _json_value(rng)}
            elif kind < 0.79:
                cid = rng.choice(calls)[0] if calls else "call-unknown"
                err: Any = {"code": "cancelled"} if rng.random() < 0.4 else _json_value(rng)
                part = {"type": "tool-error", "id": cid, "error": err}
            elif kind < 0.83:
                part = {"type": "step-finish"}
            elif kind < 0.93:
                part = {"type": "finish"}
                if rng.random() < 0.8:
                    part["reason"] = rng.choice(["stop", "aborted", "length"])
            else:
                part = {"type": "error", "error": "Something failed: " + rng.choice(_WORDS)}
                if rng.random() < 0.7:
                    part["code"] = rng.choice(_ERROR_CODES)
        out.append(_part(part, within))
    return out
