-- Placeholder on the `feed` branch only: version 3 belongs to the store branch's migration
-- (the events table). When the branches are merged, this file is replaced by that one.
SELECT 1;
