"""The Stripe stand-in of the billing tests: ``localstripe`` (a stateful Stripe fake, on PyPI) as a local
server process, plus the few endpoints it does not serve.

Run: ``python -m tests.fakes.stripe_server --port P``. Everything under ``/v1/`` that localstripe knows
(customers, products, plans, payment methods, subscriptions, invoices, events) is localstripe's own, and
so are its webhooks (``POST /_config/webhooks/<id>`` with ``url`` and ``secret``: events are signed like
Stripe's, HMAC-SHA256 with that secret). Added here, because localstripe has no such endpoints:

* ``POST /v1/checkout/sessions`` / ``GET /v1/checkout/sessions/<id>``: a session whose ``url`` is a
  payment page on this server; paying it (``POST /checkout/<id>``, card number in the form) creates the
  customer's payment method and subscription in localstripe (localstripe then sends
  ``customer.subscription.created`` and ``invoice.payment_succeeded``) and sends a signed
  ``checkout.session.completed``, then redirects to the session's ``success_url``;
* ``POST /v1/billing_portal/sessions``: a portal session whose ``url`` is a page on this server;
* ``POST /v1/billing/meter_events``: recorded (deduplicated on ``identifier``, as Stripe does); the tests
  read them at ``GET /_fake/meter_events``.

localstripe holds one item per subscription, so a checkout with a licensed and a metered price subscribes
to the licensed one only. localstripe predates Stripe's Prices: subscription items name a ``plan``, and an update takes ``prorate``
instead of ``proration_behavior``. The patch below renames them on the way in, so chatsite's code uses the
current API. localstripe's pickle of its store in /tmp is turned off (each run starts empty).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import html
import json
import secrets
import socket
import time

import aiohttp
from aiohttp import web
from localstripe import resources, server
from localstripe.server import app, get_post_data
from localstripe.webhooks import _webhooks

resources.Store.dump_to_disk = lambda self: None

SESSIONS: dict[str, dict] = {}
METER_EVENTS: dict[str, dict] = {}


def _items_to_plans(items):
    if not isinstance(items, list):
        return items
    out = []
    for item in items:
        item = dict(item)
        if "price" in item:
            item["plan"] = item.pop("price")
        out.append(item)
    return out


_sub_init = resources.Subscription.__init__
_sub_update = resources.Subscription._update


def _sub_init_prices(self, *args, items=None, **kwargs):
    _sub_init(self, *args, items=_items_to_plans(items), **kwargs)


def _sub_update_prices(self, *args, items=None, proration_behavior=None, **kwargs):
    if proration_behavior is not None and "prorate" not in kwargs:
        kwargs["prorate"] = proration_behavior != "none"
    return _sub_update(self, *args, items=_items_to_plans(items), **kwargs)


resources.Subscription.__init__ = _sub_init_prices
resources.Subscription._update = _sub_update_prices


def _new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(8)


async def send_event(event_type: str, obj: dict) -> None:
    """Sign and POST an event to every registered webhook, as localstripe does for its own."""
    created = int(time.time())
    event = {
        "id": _new_id("evt_"),
        "object": "event",
        "type": event_type,
        "created": created,
        "livemode": False,
        "data": {"object": obj},
    }
    payload = json.dumps(event).encode()
    await asyncio.sleep(0.5)
    async with aiohttp.ClientSession() as session:
        for hook in list(_webhooks.values()):
            if hook.events is not None and event_type not in hook.events:
                continue
            signature = hmac.new(
                hook.secret.encode(), b"%d.%s" % (created, payload), hashlib.sha256
            ).hexdigest()
            headers = {"Content-Type": "application/json", "Stripe-Signature": f"t={created},v1={signature}"}
            try:
                async with session.post(hook.url, data=payload, headers=headers) as response:
                    await response.read()
            except aiohttp.ClientError:
                pass


async def checkout_create(request):
    data = await get_post_data(request) or {}
    sid = _new_id("cs_test_")
    base = f"{request.scheme}://{request.host}"
    SESSIONS[sid] = {
        "id": sid,
        "object": "checkout.session",
        "mode": data.get("mode", "subscription"),
        "customer": data.get("customer"),
        "client_reference_id": data.get("client_reference_id"),
        "line_items": data.get("line_items") or [],
        "metadata": data.get("metadata") or {},
        "subscription_data": data.get("subscription_data") or {},
        "success_url": data.get("success_url"),
        "cancel_url": data.get("cancel_url"),
        "status": "open",
        "payment_status": "unpaid",
        "subscription": None,
        "url": f"{base}/checkout/{sid}",
    }
    return web.json_response(SESSIONS[sid])


async def checkout_retrieve(request):
    session = SESSIONS.get(request.match_info["id"])
    if session is None:
        return web.json_response({"error": {"message": "No such checkout session"}}, status=404)
    return web.json_response(session)


async def checkout_page(request):
    session = SESSIONS.get(request.match_info["id"])
    if session is None:
        raise web.HTTPNotFound()
    body = f"""<!doctype html><html lang="en"><head><title>Test checkout</title></head><body>
<main><h1>Test checkout</h1><form method="post"><label for="card">Card number</label>
<input id="card" name="card" value="4242424242424242"><button type="submit" id="pay">Pay</button></form>
<a href="{html.escape(session["cancel_url"] or "")}">Cancel</a></main></body></html>"""
    return web.Response(text=body, content_type="text/html")


async def checkout_pay(request):
    session = SESSIONS.get(request.match_info["id"])
    if session is None or session["status"] != "open":
        raise web.HTTPNotFound()
    form = await request.post()
    customer = session["customer"]
    pm = resources.PaymentMethod._api_create(
        type="card",
        card={
            "number": form.get("card", "4242424242424242"),
            "exp_month": "12",
            "exp_year": "2030",
            "cvc": "123",
        },
    )
    resources.PaymentMethod._api_attach(pm.id, customer=customer)
    resources.Customer._api_update(customer, invoice_settings={"default_payment_method": pm.id})
    # localstripe holds one item per subscription: the licensed price (a metered one is left out here).
    items = [
        {"plan": i["price"], **({"quantity": int(i["quantity"])} if i.get("quantity") else {})}
        for i in session["line_items"]
        if resources.Plan._api_retrieve(i["price"]).usage_type != "metered"
    ][:1]
    sub = resources.Subscription._api_create(
        customer=customer, items=items, metadata=session["subscription_data"].get("metadata") or {}
    )
    session.update(status="complete", payment_status="paid", subscription=sub.id)
    asyncio.ensure_future(send_event("checkout.session.completed", dict(session)))
    raise web.HTTPSeeOther(session["success_url"])


async def portal_create(request):
    data = await get_post_data(request) or {}
    pid = _new_id("bps_")
    base = f"{request.scheme}://{request.host}"
    return web.json_response(
        {
            "id": pid,
            "object": "billing_portal.session",
            "customer": data.get("customer"),
            "return_url": data.get("return_url"),
            "url": f"{base}/portal/{pid}",
        }
    )


async def portal_page(request):
    return web.Response(
        text="<!doctype html><title>Test billing portal</title><h1>Billing portal</h1>",
        content_type="text/html",
    )


async def meter_event_create(request):
    data = await get_post_data(request) or {}
    identifier = data.get("identifier") or _new_id("mev_")
    METER_EVENTS.setdefault(identifier, {**data, "identifier": identifier, "object": "billing.meter_event"})
    return web.json_response(METER_EVENTS[identifier])


async def meter_events_list(request):
    return web.json_response(list(METER_EVENTS.values()))


@web.middleware
async def pages_or_api_auth(request, handler):
    """The payment and portal pages are for a browser (no API key); the API keeps localstripe's check."""
    if request.path.startswith(("/checkout/", "/portal/", "/_fake/")):
        return await handler(request)
    return await server.auth_middleware(request, handler)


app.middlewares[app.middlewares.index(server.auth_middleware)] = pages_or_api_auth
app.router.add_post("/v1/checkout/sessions", checkout_create)
app.router.add_get("/v1/checkout/sessions/{id}", checkout_retrieve)
app.router.add_get("/checkout/{id}", checkout_page)
app.router.add_post("/checkout/{id}", checkout_pay)
app.router.add_post("/v1/billing_portal/sessions", portal_create)
app.router.add_get("/portal/{id}", portal_page)
app.router.add_post("/v1/billing/meter_events", meter_event_create)
app.router.add_get("/_fake/meter_events", meter_events_list)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    web.run_app(app, sock=sock, print=None)


if __name__ == "__main__":
    main()
