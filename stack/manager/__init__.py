"""The model manager: several models behind one gateway, switched on demand (resident, sleeping, cold).

states.py (the state machine), policy.py (pure decisions), slot.py (one model), manager.py (switching,
single flight, queue), supervise.py (crashes, restarts, idle TTL), memory.py (needs and NVML).
"""
