"""Who verifies and settles payments: an external facilitator over HTTP, our own (the internal
facilitator, with its fee payer), failover between them and their health."""
