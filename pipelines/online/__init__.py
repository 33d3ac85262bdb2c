"""Online learning: the click join, the traffic simulator and the trainer that keeps a served model fresh."""
