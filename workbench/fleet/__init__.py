"""Many replicas of the engine behind one router (docs/fleet.md)."""
