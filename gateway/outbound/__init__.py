"""The one way out to third parties: the upstream client, its metrics, bounded reads, Solana RPC."""
