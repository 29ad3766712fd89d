"""Queues: one OS process per queue, its index, its own small-message store and the
variable queue (alpha/beta/gamma/delta). Nothing lives here yet; the queue issue fills it.
"""
