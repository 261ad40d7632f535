"""The HTTP gateway: routes over the in-memory projections."""
