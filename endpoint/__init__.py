"""The consumers' side: one proxy address that rotates through the live pool for them
(``ppf serve``). Pure parts (``login``, ``choose``) and the one boundary (``relay``)."""
