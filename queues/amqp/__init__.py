"""AMQP 0-9-1 on a port: a translator between the wire and Warren's own processes.

``frames`` splits the byte stream into frames and codes the hot methods by hand (a
publish with its content, a delivery, a get, acks and confirms), leaving the other
methods to pamqp; ``session`` is one connection's protocol without its socket: the
handshake, authentication, tuning, channels and their closing, with RabbitMQ's reply
codes. Nothing here stores a message: what a client publishes goes to the queue and
stream processes that exist, with the property bytes it sent.
"""
