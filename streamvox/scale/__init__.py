"""StreamVox replicas on Ray Serve: `streamvox serve --replicas N` (docs/scaling.md).

Each replica is a whole StreamVox server (front end and engine core) built inside a Serve replica;
Serve's proxy routes HTTP, SSE and both WebSockets to them. `proxy` runs inside Serve's proxy,
`replica_app` and `voice_sync` inside each replica, `flow` is the protocol between the two, and
`launch` starts (or joins) the Ray cluster. Only `deployment` and `launch` import Ray.
"""
