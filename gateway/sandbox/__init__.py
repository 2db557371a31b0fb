"""The offline sandbox: a local Solana chain, sample upstreams and the gateway, in one process.

* :mod:`gateway.sandbox.chain`: LiteSVM behind a loopback JSON-RPC server, and the USDC chain
  setup (also the tests' Solana node);
* :mod:`gateway.sandbox.upstreams`: deterministic DAS and asset-data samples;
* :mod:`gateway.sandbox.state`: what ``--state-dir`` keeps (key file, chain, ports, secrets);
* :mod:`gateway.sandbox.ports`: each part's port, kept across restarts;
* :mod:`gateway.sandbox.environment`: the gateway's environment (also ``--print-env``) and the
  SDK examples' exports;
* :mod:`gateway.sandbox.run`: ``x402-gateway sandbox``.
"""

from __future__ import annotations

from gateway.sandbox.run import run_sandbox

__all__ = ["run_sandbox"]
