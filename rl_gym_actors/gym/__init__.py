"""Both sides of the Gym checkpoint participant wire: client, participant state, store, server, agents."""
