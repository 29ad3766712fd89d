"""The actor runtime: pykka actors living in their own OS processes, over ZeroMQ."""
