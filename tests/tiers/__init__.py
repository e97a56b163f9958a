"""Tiers that need an outside install or service, one folder each (named as its marker); they skip unless asked for
(``-m <tier>``, the folder or file named, or ``FABRIC_LITE_<TIER>=1``)."""
