// Command ocipack writes a single-layer OCI image layout as a tar archive that
// `ctr images import` accepts, and checks such archives. Stdlib only.
//
//	ocipack pack --name REF --out FILE.tar [--entrypoint JSON] [--cmd JSON]
//	             [--env K=V]... [--workdir DIR]
//	             [--file DST=SRC]... [--symlink DST=TARGET]... [--dir DST=MODE]...
//	ocipack verify FILE.tar...
//
// The archive is reproducible: same inputs, same bytes (fixed timestamps,
// root ownership, sorted entries).
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

const (
	mediaIndex    = "application/vnd.oci.image.index.v1+json"
	mediaManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaConfig   = "application/vnd.oci.image.config.v1+json"
	mediaLayerGz  = "application/vnd.oci.image.layer.v1.tar+gzip"

	annContainerdName = "io.containerd.image.name"
	annOCIRefName     = "org.opencontainers.image.ref.name"
)

// epoch is the timestamp of every file and of the image itself.
var epoch = time.Unix(0, 0).UTC()

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Platform    *platform         `json:"platform,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

type index struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Manifests     []descriptor `json:"manifests"`
}

type manifest struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Config        descriptor   `json:"config"`
	Layers        []descriptor `json:"layers"`
}

type imageConfig struct {
	Created      string `json:"created"`
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
	Config       struct {
		Env        []string `json:"Env,omitempty"`
		Entrypoint []string `json:"Entrypoint,omitempty"`
		Cmd        []string `json:"Cmd,omitempty"`
		WorkingDir string   `json:"WorkingDir,omitempty"`
	} `json:"config"`
	RootFS struct {
		Type    string   `json:"type"`
		DiffIDs []string `json:"diff_ids"`
	} `json:"rootfs"`
	History []struct {
		Created   string `json:"created"`
		CreatedBy string `json:"created_by"`
	} `json:"history,omitempty"`
}

// listFlag collects a repeatable flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: ocipack pack|verify ...")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "pack":
		err = runPack(os.Args[2:])
	case "verify":
		err = runVerify(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q (want pack or verify)", os.Args[1])
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "ocipack: %v\n", err)
		os.Exit(1)
	}
}

// entry is one file system object of the layer.
type entry struct {
	typ    byte   // tar.TypeReg, tar.TypeDir, tar.TypeSymlink
	mode   int64  // permission bits
	src    string // TypeReg: file to copy
	target string // TypeSymlink: link target
}

func runPack(args []string) error {
	fs := flag.NewFlagSet("ocipack pack", flag.ContinueOnError)
	name := fs.String("name", "", "image reference, e.g. localhost/torpor-test/pause:latest")
	out := fs.String("out", "", "archive to write")
	entrypoint := fs.String("entrypoint", "", `Entrypoint as a JSON array, e.g. ["/pause"]`)
	cmd := fs.String("cmd", "", `Cmd as a JSON array`)
	workdir := fs.String("workdir", "/", "WorkingDir")
	var envs, files, links, dirs listFlag
	fs.Var(&envs, "env", "K=V environment entry (repeatable)")
	fs.Var(&files, "file", "DST=SRC regular file (repeatable; mode from SRC)")
	fs.Var(&links, "symlink", "DST=TARGET symbolic link (repeatable)")
	fs.Var(&dirs, "dir", "DST=MODE directory with octal mode (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *name == "" || *out == "" {
		return errors.New("pack: --name and --out are required")
	}
	tag := "latest"
	if i := strings.LastIndex(*name, ":"); i > strings.LastIndex(*name, "/") {
		tag = (*name)[i+1:]
	} else {
		return fmt.Errorf("pack: --name %q has no tag", *name)
	}

	entries := map[string]entry{}
	add := func(dst string, e entry) error {
		p := strings.TrimPrefix(path.Clean("/"+dst), "/")
		if p == "" {
			return fmt.Errorf("pack: bad destination %q", dst)
		}
		if _, dup := entries[p]; dup {
			return fmt.Errorf("pack: %s given twice", dst)
		}
		entries[p] = e
		return nil
	}
	for _, f := range files {
		dst, src, ok := strings.Cut(f, "=")
		if !ok {
			return fmt.Errorf("pack: --file %q is not DST=SRC", f)
		}
		st, err := os.Stat(src)
		if err != nil {
			return fmt.Errorf("pack: %w", err)
		}
		if !st.Mode().IsRegular() {
			return fmt.Errorf("pack: %s is not a regular file", src)
		}
		if err := add(dst, entry{typ: tar.TypeReg, mode: int64(st.Mode().Perm()), src: src}); err != nil {
			return err
		}
	}
	for _, l := range links {
		dst, target, ok := strings.Cut(l, "=")
		if !ok || target == "" {
			return fmt.Errorf("pack: --symlink %q is not DST=TARGET", l)
		}
		if err := add(dst, entry{typ: tar.TypeSymlink, mode: 0o777, target: target}); err != nil {
			return err
		}
	}
	for _, d := range dirs {
		dst, m, ok := strings.Cut(d, "=")
		mode, err := strconv.ParseInt(m, 8, 32)
		if !ok || err != nil {
			return fmt.Errorf("pack: --dir %q is not DST=OCTALMODE", d)
		}
		if err := add(dst, entry{typ: tar.TypeDir, mode: mode}); err != nil {
			return err
		}
	}
	// Parent directories that were not given explicitly get mode 0755.
	for p := range entries {
		for d := path.Dir(p); d != "." && d != "/"; d = path.Dir(d) {
			if e, ok := entries[d]; ok {
				if e.typ != tar.TypeDir {
					return fmt.Errorf("pack: %s is used as a directory but is not one", d)
				}
				continue
			}
			entries[d] = entry{typ: tar.TypeDir, mode: 0o755}
		}
	}

	layer, err := buildLayer(entries)
	if err != nil {
		return err
	}
	diffID := digestOf(layer)
	var gz bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gz, gzip.BestCompression)
	if err != nil {
		return err
	}
	if _, err := zw.Write(layer); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}

	var cfg imageConfig
	cfg.Created = epoch.Format(time.RFC3339)
	cfg.Architecture, cfg.OS = "amd64", "linux"
	cfg.Config.Env = envs
	cfg.Config.WorkingDir = *workdir
	if err := parseJSONList(*entrypoint, &cfg.Config.Entrypoint); err != nil {
		return fmt.Errorf("pack: --entrypoint: %w", err)
	}
	if err := parseJSONList(*cmd, &cfg.Config.Cmd); err != nil {
		return fmt.Errorf("pack: --cmd: %w", err)
	}
	cfg.RootFS.Type = "layers"
	cfg.RootFS.DiffIDs = []string{diffID}
	cfg.History = append(cfg.History, struct {
		Created   string `json:"created"`
		CreatedBy string `json:"created_by"`
	}{cfg.Created, "torpor test/images/build.sh"})
	cfgJSON, err := json.Marshal(cfg)
	if err != nil {
		return err
	}

	blobs := map[string][]byte{}
	put := func(media string, b []byte) descriptor {
		d := digestOf(b)
		blobs[d] = b
		return descriptor{MediaType: media, Digest: d, Size: int64(len(b))}
	}
	man := manifest{SchemaVersion: 2, MediaType: mediaManifest,
		Config: put(mediaConfig, cfgJSON),
		Layers: []descriptor{put(mediaLayerGz, gz.Bytes())}}
	manJSON, err := json.Marshal(man)
	if err != nil {
		return err
	}
	manDesc := put(mediaManifest, manJSON)
	manDesc.Platform = &platform{Architecture: "amd64", OS: "linux"}
	// ctr (containerd) names the image after io.containerd.image.name; the
	// OCI ref.name annotation holds the tag only, as `ctr export` writes it.
	manDesc.Annotations = map[string]string{annContainerdName: *name, annOCIRefName: tag}
	idxJSON, err := json.Marshal(index{SchemaVersion: 2, MediaType: mediaIndex, Manifests: []descriptor{manDesc}})
	if err != nil {
		return err
	}

	return writeArchive(*out, idxJSON, blobs)
}

func parseJSONList(s string, dst *[]string) error {
	if s == "" {
		return nil
	}
	return json.Unmarshal([]byte(s), dst)
}

func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// buildLayer returns the uncompressed layer tar of entries, sorted by path
// (so every directory comes before its contents).
func buildLayer(entries map[string]entry) ([]byte, error) {
	paths := make([]string, 0, len(entries))
	for p := range entries {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range paths {
		e := entries[p]
		h := &tar.Header{Typeflag: e.typ, Name: p, Mode: e.mode, ModTime: epoch, Format: tar.FormatPAX}
		var data []byte
		switch e.typ {
		case tar.TypeDir:
			h.Name += "/"
		case tar.TypeSymlink:
			h.Linkname = e.target
		case tar.TypeReg:
			var err error
			if data, err = os.ReadFile(e.src); err != nil {
				return nil, err
			}
			h.Size = int64(len(data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// writeArchive writes the OCI layout tar to out (via a temporary file in the
// same directory, renamed into place).
func writeArchive(out string, idxJSON []byte, blobs map[string][]byte) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(out), ".ocipack-*.tar")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	tw := tar.NewWriter(tmp)
	put := func(name string, typ byte, b []byte) error {
		h := &tar.Header{Typeflag: typ, Name: name, Mode: 0o644, Size: int64(len(b)), ModTime: epoch, Format: tar.FormatPAX}
		if typ == tar.TypeDir {
			h.Mode, h.Size = 0o755, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err := tw.Write(b)
		return err
	}
	if err := put("oci-layout", tar.TypeReg, []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := put("index.json", tar.TypeReg, idxJSON); err != nil {
		return err
	}
	if err := put("blobs/", tar.TypeDir, nil); err != nil {
		return err
	}
	if err := put("blobs/sha256/", tar.TypeDir, nil); err != nil {
		return err
	}
	digests := make([]string, 0, len(blobs))
	for d := range blobs {
		digests = append(digests, d)
	}
	sort.Strings(digests)
	for _, d := range digests {
		if err := put("blobs/sha256/"+strings.TrimPrefix(d, "sha256:"), tar.TypeReg, blobs[d]); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), out)
}

// runVerify checks archives written by pack (or any single-platform OCI
// layout tar): layout version, every blob's digest and size, the manifest's
// media types, the config's os/architecture and that rootfs.diff_ids are the
// digests of the uncompressed layers, and the name annotations.
func runVerify(files []string) error {
	if len(files) == 0 {
		return errors.New("verify: no archive given")
	}
	for _, f := range files {
		name, err := verifyArchive(f)
		if err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		fmt.Printf("%s: ok (%s)\n", f, name)
	}
	return nil
}

func verifyArchive(file string) (string, error) {
	fh, err := os.Open(file)
	if err != nil {
		return "", err
	}
	defer fh.Close()
	members := map[string][]byte{}
	tr := tar.NewReader(fh)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return "", err
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return "", err
		}
		members[path.Clean(h.Name)] = b
	}
	if !bytes.Contains(members["oci-layout"], []byte(`"imageLayoutVersion":"1.0.0"`)) {
		return "", errors.New("oci-layout missing or not version 1.0.0")
	}
	blob := func(d descriptor) ([]byte, error) {
		hexd, ok := strings.CutPrefix(d.Digest, "sha256:")
		if !ok {
			return nil, fmt.Errorf("digest %q is not sha256", d.Digest)
		}
		b, ok := members["blobs/sha256/"+hexd]
		if !ok {
			return nil, fmt.Errorf("blob %s missing", d.Digest)
		}
		if got := digestOf(b); got != d.Digest {
			return nil, fmt.Errorf("blob %s has digest %s", d.Digest, got)
		}
		if int64(len(b)) != d.Size {
			return nil, fmt.Errorf("blob %s has size %d, descriptor says %d", d.Digest, len(b), d.Size)
		}
		return b, nil
	}
	var idx index
	if err := json.Unmarshal(members["index.json"], &idx); err != nil {
		return "", fmt.Errorf("index.json: %w", err)
	}
	if idx.SchemaVersion != 2 || len(idx.Manifests) != 1 {
		return "", fmt.Errorf("index.json: want schemaVersion 2 and one manifest, got %d and %d", idx.SchemaVersion, len(idx.Manifests))
	}
	md := idx.Manifests[0]
	name := md.Annotations[annContainerdName]
	if name == "" || md.Annotations[annOCIRefName] == "" {
		return "", fmt.Errorf("index.json: manifest lacks %s or %s annotation", annContainerdName, annOCIRefName)
	}
	if md.MediaType != mediaManifest {
		return "", fmt.Errorf("index.json: manifest media type %q", md.MediaType)
	}
	mb, err := blob(md)
	if err != nil {
		return "", err
	}
	var man manifest
	if err := json.Unmarshal(mb, &man); err != nil {
		return "", fmt.Errorf("manifest: %w", err)
	}
	if man.SchemaVersion != 2 || man.Config.MediaType != mediaConfig {
		return "", errors.New("manifest: bad schemaVersion or config media type")
	}
	cb, err := blob(man.Config)
	if err != nil {
		return "", err
	}
	var cfg imageConfig
	if err := json.Unmarshal(cb, &cfg); err != nil {
		return "", fmt.Errorf("config: %w", err)
	}
	if cfg.OS != "linux" || cfg.Architecture != "amd64" {
		return "", fmt.Errorf("config: platform %s/%s, want linux/amd64", cfg.OS, cfg.Architecture)
	}
	if cfg.RootFS.Type != "layers" || len(cfg.RootFS.DiffIDs) != len(man.Layers) {
		return "", errors.New("config: rootfs.diff_ids do not match the layers")
	}
	for i, ld := range man.Layers {
		lb, err := blob(ld)
		if err != nil {
			return "", err
		}
		var raw []byte
		switch ld.MediaType {
		case mediaLayerGz:
			zr, err := gzip.NewReader(bytes.NewReader(lb))
			if err != nil {
				return "", fmt.Errorf("layer %d: %w", i, err)
			}
			if raw, err = io.ReadAll(zr); err != nil {
				return "", fmt.Errorf("layer %d: %w", i, err)
			}
		case "application/vnd.oci.image.layer.v1.tar":
			raw = lb
		default:
			return "", fmt.Errorf("layer %d: media type %q", i, ld.MediaType)
		}
		if got := digestOf(raw); got != cfg.RootFS.DiffIDs[i] {
			return "", fmt.Errorf("layer %d: uncompressed digest %s, diff_id says %s", i, got, cfg.RootFS.DiffIDs[i])
		}
		if _, err := tar.NewReader(bytes.NewReader(raw)).Next(); err != nil {
			return "", fmt.Errorf("layer %d: not a tar: %w", i, err)
		}
	}
	if len(cfg.Config.Entrypoint) == 0 && len(cfg.Config.Cmd) == 0 {
		return "", errors.New("config: neither Entrypoint nor Cmd set")
	}
	return name, nil
}
