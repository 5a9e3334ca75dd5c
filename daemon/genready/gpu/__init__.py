"""Who holds the GPUs and what they cost: the providers (NVML, nvidia-smi) and the attribution of
each GPU process to a unit's start (`attribution`). Nothing here runs on the event loop."""
