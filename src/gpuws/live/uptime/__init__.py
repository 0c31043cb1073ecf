"""The pod's up time (issue 22): started and stopped by the provider's own tool
(:mod:`.power`), stopped by its own lease when nobody uses it (:mod:`.lease`), and the
stops the laptop did not perform but observed (:mod:`.observed`)."""
