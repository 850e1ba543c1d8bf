"""The wire: the message schema, the MPI channel, the lifelines and the rank map. Imports no
component package, so every rank's code and every component can depend on it."""
