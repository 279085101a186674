"""`tandem calibrate`: trains a pair's learned heads (engine/heads/) from the target's replies."""
