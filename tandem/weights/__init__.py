"""The weight plane: actor -> rollout weights, outside the controller (gigabytes per sync, which one
controller process must not carry; docs/weight-plane.md).

layout.py (the manifest and the flat byte layout every transport moves), source.py (the
actor's side: one export per version, served to every replica), staging.py (each rollout
rank's staging buffer and the in-place swap), receiver.py (the rollout front's sync:
manifest, transport, commit), transport.py (which transport), group.py (the weight process
group), ipc.py (CUDA IPC handles), wire.py / client.py / source_servicer.py (the protos).
"""
