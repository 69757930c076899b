"""A small Gym-shaped stack: model server, agent server with a harness, resources server with
a verifier and a judge, and a rollout-collection driver, each server its own process."""
