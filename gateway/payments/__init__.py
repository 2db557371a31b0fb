"""The payment core of ``exact`` routes, free of any web framework.

* :mod:`~gateway.payments.gate` - :class:`PaymentGate`: header and body -> Refused, Replay,
  Reconcile, Conflict, Limited or Paid (the checks before the upstream is called).
* :mod:`~gateway.payments.settlement` - :class:`Settlement`: a paid request and its answer ->
  Delivered, Pending, Interrupted, Failed or Refused (write-ahead, reconcile, deliver once).
* :mod:`~gateway.payments.results` - those tagged values and the one :class:`PaidRequest`.
* :mod:`~gateway.payments.matching` - the local checks of a payment against a route.
* :mod:`~gateway.payments.ledger` - the money state in the shared store.
* :mod:`~gateway.payments.offer` - a route's price as its 402 challenge.
* :mod:`~gateway.payments.facilitators` - who verifies and settles: the protocol, the HTTP
  client of an external facilitator (:mod:`~gateway.payments.cdp_auth` signs its requests) and
  the fee payer a challenge advertises; :mod:`~gateway.payments.local_facilitator` settles
  with our own wallet.

:mod:`gateway.methods.exact` binds these to a route as the ``exact`` payment method; the one
access layer in ``middleware/`` renders their results.
"""

from gateway.payments.gate import PaymentGate
from gateway.payments.ledger import PaymentLedger, PendingSettlement, StoredResponse
from gateway.payments.offer import exact_challenge
from gateway.payments.results import (
    Authorization,
    Candidate,
    Conflict,
    Delivered,
    Failed,
    InProgress,
    Interrupted,
    Paid,
    PaidRequest,
    Pending,
    Reconcile,
    Refused,
    Replay,
    Settled,
)
from gateway.payments.settlement import Settlement

__all__ = [
    "Authorization",
    "Candidate",
    "Conflict",
    "Delivered",
    "Failed",
    "InProgress",
    "Interrupted",
    "Paid",
    "PaidRequest",
    "PaymentGate",
    "PaymentLedger",
    "Pending",
    "PendingSettlement",
    "Reconcile",
    "Refused",
    "Replay",
    "Settled",
    "Settlement",
    "StoredResponse",
    "exact_challenge",
]
