"""The controller as a long-lived service: run queue, service pool, gRPC and HTTP front (`tandem controller`)."""
