"""Pure, synchronous state machines: no Ray, no sockets, no clock reads."""
