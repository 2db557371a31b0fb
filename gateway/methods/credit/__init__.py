"""Prepaid credit: a top-up paid once with ``exact``, then calls taken from it by sign-in or session.

* :mod:`~gateway.methods.credit.method` - binds the method to a route (challenge, check, finish).
* :mod:`~gateway.methods.credit.book` - balances, holds and takes in the shared store.
* :mod:`~gateway.methods.credit.sessions` - one sign-in, many calls, under a signed cap.
* :mod:`~gateway.methods.credit.calls` - a call paid once is answered again on retry.
* :mod:`~gateway.methods.credit.lapse` - credit unused past its lapse date, swept and counted.
* :mod:`~gateway.methods.credit.handlers` - the top-up, balance and session routes.
* :mod:`~gateway.methods.credit.wire` - those routes' answers on the wire.
* :mod:`~gateway.methods.credit.metrics` - credit sold, spent and lapsed, for the books.
"""
