package main

import (
	"bytes"
	"crypto/sha1" //nolint:gosec // SPDX 2.3 requires a SHA1 checksum of every file
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/url"
	"path"
	"regexp"
	"runtime/debug"
	"strings"
	"time"
)

// The SPDX 2.3 JSON document: the fields an SBOM of a Go binary uses.
type (
	spdxDocument struct {
		SPDXVersion       string             `json:"spdxVersion"`
		DataLicense       string             `json:"dataLicense"`
		SPDXID            string             `json:"SPDXID"`
		Name              string             `json:"name"`
		DocumentNamespace string             `json:"documentNamespace"`
		CreationInfo      spdxCreationInfo   `json:"creationInfo"`
		Packages          []spdxPackage      `json:"packages"`
		Files             []spdxFile         `json:"files"`
		Relationships     []spdxRelationship `json:"relationships"`
	}
	spdxCreationInfo struct {
		Created  string   `json:"created"`
		Creators []string `json:"creators"`
	}
	spdxPackage struct {
		Name                  string            `json:"name"`
		SPDXID                string            `json:"SPDXID"`
		VersionInfo           string            `json:"versionInfo,omitempty"`
		DownloadLocation      string            `json:"downloadLocation"`
		FilesAnalyzed         bool              `json:"filesAnalyzed"`
		Checksums             []spdxChecksum    `json:"checksums,omitempty"`
		LicenseConcluded      string            `json:"licenseConcluded"`
		LicenseDeclared       string            `json:"licenseDeclared"`
		CopyrightText         string            `json:"copyrightText"`
		Comment               string            `json:"comment,omitempty"`
		ExternalRefs          []spdxExternalRef `json:"externalRefs,omitempty"`
		PrimaryPackagePurpose string            `json:"primaryPackagePurpose"`
	}
	spdxFile struct {
		FileName         string         `json:"fileName"`
		SPDXID           string         `json:"SPDXID"`
		FileTypes        []string       `json:"fileTypes"`
		Checksums        []spdxChecksum `json:"checksums"`
		LicenseConcluded string         `json:"licenseConcluded"`
		CopyrightText    string         `json:"copyrightText"`
	}
	spdxChecksum struct {
		Algorithm     string `json:"algorithm"`
		ChecksumValue string `json:"checksumValue"`
	}
	spdxExternalRef struct {
		ReferenceCategory string `json:"referenceCategory"`
		ReferenceType     string `json:"referenceType"`
		ReferenceLocator  string `json:"referenceLocator"`
	}
	spdxRelationship struct {
		SPDXElementID      string `json:"spdxElementId"`
		RelationshipType   string `json:"relationshipType"`
		RelatedSPDXElement string `json:"relatedSpdxElement"`
	}
)

// spdxCreator names this tool as the SBOMs' creator.
const spdxCreator = "Tool: github.com/queen-locks/queen-locks/hack/image"

const noAssertion = "NOASSERTION"

// sbom is the SPDX 2.3 JSON document of the Go binary data, which is at
// inImage in the image imageName for the platform p: from the build
// information the Go linker embeds (debug/buildinfo, what `go version -m`
// prints), one package per module (the main module, each dependency as
// replaced, if it is), one for the Go toolchain's standard library, and
// the binary itself as a file. It depends on its inputs only, so that the
// same binary gives the same document.
func sbom(data []byte, imageName, inImage string, p platform, created time.Time) ([]byte, error) {
	bi, err := buildinfo.Read(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("no Go build information to make an SBOM from: %w", err)
	}
	return spdxOf(bi, data, imageName, inImage, p, created)
}

// spdxOf is sbom's document, from the build information bi of data.
func spdxOf(bi *debug.BuildInfo, data []byte, imageName, inImage string, p platform, created time.Time) ([]byte, error) {
	base := path.Base(inImage)
	sha256sum := sha256.Sum256(data)
	sha1sum := sha1.Sum(data) //nolint:gosec // required by SPDX, not used for security
	doc := spdxDocument{
		SPDXVersion: "SPDX-2.3",
		DataLicense: "CC0-1.0",
		SPDXID:      "SPDXRef-DOCUMENT",
		Name:        fmt.Sprintf("%s %s %s", imageName, inImage, p),
		// Unique per binary and platform without anything random: the
		// binary's hash.
		DocumentNamespace: fmt.Sprintf("https://spdx.org/spdxdocs/%s-%s-%x", base, p.dashed(), sha256sum),
		CreationInfo: spdxCreationInfo{
			Created:  created.UTC().Format(time.RFC3339),
			Creators: []string{spdxCreator},
		},
	}
	fileID := "SPDXRef-File-" + spdxIDPart(base)
	doc.Files = []spdxFile{{
		FileName:  "." + inImage,
		SPDXID:    fileID,
		FileTypes: []string{"BINARY"},
		Checksums: []spdxChecksum{
			{Algorithm: "SHA1", ChecksumValue: hex.EncodeToString(sha1sum[:])},
			{Algorithm: "SHA256", ChecksumValue: hex.EncodeToString(sha256sum[:])},
		},
		LicenseConcluded: noAssertion,
		CopyrightText:    noAssertion,
	}}

	// The main module, as the application the binary is.
	mainPkg := modulePackage(0, bi.Main.Path, bi.Main.Version, bi.Main.Sum)
	mainPkg.PrimaryPackagePurpose = "APPLICATION"
	mainPkg.Comment = fmt.Sprintf("The main module of %s (package %s), built by %s with%s.",
		inImage, bi.Path, bi.GoVersion, buildSettings(bi.Settings))
	doc.Packages = append(doc.Packages, mainPkg)
	doc.Relationships = append(doc.Relationships,
		spdxRelationship{"SPDXRef-DOCUMENT", "DESCRIBES", mainPkg.SPDXID},
		spdxRelationship{"SPDXRef-DOCUMENT", "DESCRIBES", fileID},
		spdxRelationship{fileID, "GENERATED_FROM", mainPkg.SPDXID},
	)
	for i, d := range bi.Deps {
		pkg := modulePackage(i+1, d.Path, d.Version, d.Sum)
		if r := d.Replace; r != nil {
			pkg = modulePackage(i+1, r.Path, r.Version, r.Sum)
			pkg.Comment = strings.TrimSpace(fmt.Sprintf("Replaces %s %s. %s", d.Path, d.Version, pkg.Comment))
		}
		doc.Packages = append(doc.Packages, pkg)
		doc.Relationships = append(doc.Relationships, spdxRelationship{mainPkg.SPDXID, "DEPENDS_ON", pkg.SPDXID})
	}

	// The standard library, at the toolchain's version ("go1.26.0", or
	// "go1.26.0 X:experiment", or a development version).
	goVersion, _, _ := strings.Cut(bi.GoVersion, " ")
	std := spdxPackage{
		Name:                  "stdlib",
		SPDXID:                fmt.Sprintf("SPDXRef-Package-%d-stdlib", len(bi.Deps)+1),
		VersionInfo:           goVersion,
		DownloadLocation:      noAssertion,
		LicenseConcluded:      noAssertion,
		LicenseDeclared:       noAssertion,
		CopyrightText:         noAssertion,
		Comment:               "The Go standard library and runtime of the toolchain that built the binary: " + bi.GoVersion + ".",
		PrimaryPackagePurpose: "LIBRARY",
	}
	purl := "pkg:golang/stdlib"
	if release.MatchString(goVersion) {
		// As syft and the vulnerability databases write it: 1.26.0.
		purl += "@" + strings.TrimPrefix(goVersion, "go")
	}
	std.ExternalRefs = []spdxExternalRef{{"PACKAGE-MANAGER", "purl", purl}}
	doc.Packages = append(doc.Packages, std)
	doc.Relationships = append(doc.Relationships, spdxRelationship{mainPkg.SPDXID, "DEPENDS_ON", std.SPDXID})

	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(doc); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// release is a Go release's version: go1.26, go1.26.0, go1.27rc1.
var release = regexp.MustCompile(`^go1(\.[0-9]+)+((rc|beta)[0-9]+)?$`)

// modulePackage is the SPDX package of a module, the i-th in the document:
// its go.sum hash ("h1:" and the base64 of a SHA-256) is given as a SHA256
// checksum in hex, as syft does, and as it is in the comment.
func modulePackage(i int, modPath, version, sum string) spdxPackage {
	pkg := spdxPackage{
		Name:                  modPath,
		SPDXID:                fmt.Sprintf("SPDXRef-Package-%d-%s", i, spdxIDPart(modPath)),
		VersionInfo:           version,
		DownloadLocation:      noAssertion,
		LicenseConcluded:      noAssertion,
		LicenseDeclared:       noAssertion,
		CopyrightText:         noAssertion,
		PrimaryPackagePurpose: "LIBRARY",
	}
	if h, ok := strings.CutPrefix(sum, "h1:"); ok {
		if raw, err := base64.StdEncoding.DecodeString(h); err == nil && len(raw) == sha256.Size {
			pkg.Checksums = []spdxChecksum{{Algorithm: "SHA256", ChecksumValue: hex.EncodeToString(raw)}}
		}
	}
	if sum != "" {
		pkg.Comment = "go.sum hash: " + sum
	}
	if p := goPURL(modPath, version); p != "" {
		pkg.ExternalRefs = []spdxExternalRef{{"PACKAGE-MANAGER", "purl", p}}
	}
	return pkg
}

// goPURL is the package URL of a Go module (purl-spec, type golang): the
// module path as namespace and name, lowercased, and the version, if it is
// one ("(devel)", the main module's when not stamped, is not). A module
// replaced by a directory has none.
func goPURL(modPath, version string) string {
	if modPath == "" || strings.HasPrefix(modPath, ".") || strings.HasPrefix(modPath, "/") {
		return ""
	}
	segs := strings.Split(strings.ToLower(modPath), "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	p := "pkg:golang/" + strings.Join(segs, "/")
	if version != "" && version != "(devel)" {
		p += "@" + url.PathEscape(version)
	}
	return strings.ReplaceAll(p, "+", "%2B")
}

// buildSettings is the build settings `go version -m` prints, on one line.
func buildSettings(settings []debug.BuildSetting) string {
	var b strings.Builder
	for _, s := range settings {
		v := s.Value
		if strings.ContainsAny(v, " \t") {
			v = fmt.Sprintf("%q", v)
		}
		fmt.Fprintf(&b, " %s=%s", s.Key, v)
	}
	if b.Len() == 0 {
		return "out build settings"
	}
	return b.String() // " -trimpath=true CGO_ENABLED=0 ..."
}

// spdxIDPart is s in the characters an SPDX identifier allows.
func spdxIDPart(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' {
			return r
		}
		return '-'
	}, s)
}
