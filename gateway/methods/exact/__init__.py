"""The ``exact`` way of paying: one on-chain USDC transfer per call, settled after success.

* :mod:`~gateway.methods.exact.method` - binds the method to a route (challenge, check, finish).
* :mod:`~gateway.methods.exact.gate` - :class:`PaymentGate`: header and body -> Refused, Replay,
  Reconcile, Conflict, Limited or Paid (the checks before the upstream is called).
* :mod:`~gateway.methods.exact.settlement` - :class:`Settlement`: a paid request and its answer ->
  Delivered, Pending, Interrupted, Failed or Refused (write-ahead, reconcile, deliver once).
* :mod:`~gateway.methods.exact.matching` - the local checks of a payment against a route.
* :mod:`~gateway.methods.exact.ledger` - the money state of one payment in the shared store.
* :mod:`~gateway.methods.exact.offer` - a route's price as its 402 challenge.
* :mod:`~gateway.methods.exact.fee_guard` - what a failed settlement may cost the fee payer.
* :mod:`~gateway.methods.exact.confirmations` - settlements that land after the answer.

Who verifies and settles lives in :mod:`gateway.facilitators`; the one access layer in
``middleware/`` renders what the method decided. The package imports nothing on purpose, so that
importing one part never drags in the others.
"""
