"""One module per route (or pair of routes): the handler and the store read it makes."""
