"""What kubelet talks to: the device plugin (`device_plugin`), the DRA plugin's registration and gRPC
service (`dra_service`), and kubelet's own checkpoint as read by the agent (`kubelet_checkpoint`)."""
