"""The commands themselves: create (request → allocation → host side → spec edit), delete,
resize, and the refusal log; each a call into the rooms below it."""
