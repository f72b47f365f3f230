"""Tools and environments the rollout calls during multi-turn generation."""
