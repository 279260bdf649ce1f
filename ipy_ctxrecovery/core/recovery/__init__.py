"""What happens after a request fails: the evidence a network path gives about its limits
(:mod:`.evidence`) and the response to one failure (:mod:`.policy`). Pure: no I/O."""
