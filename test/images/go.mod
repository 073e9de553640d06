module torpor/test/images

go 1.22
