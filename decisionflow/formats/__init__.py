"""Date formats for every admin page: seconds and the zone named, as the custom pages show
them ("2026-11-30 13:08:35 UTC", ``workplace.display.when``). Django's English
default ("Nov. 30, 2026, 1:08 p.m.") has neither, so two events a second apart looked alike."""
